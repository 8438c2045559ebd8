import Foundation
import Runtime

/// One HTTP/2 connection of an `HTTP2Client`: the driver of its stream loop, which owns the
/// socket, the `SSL*` and the `HTTP2Session` on its one thread.
///
/// Any task may `enqueue` an exchange; the loop opens a stream for it as soon as the
/// server's `SETTINGS_MAX_CONCURRENT_STREAMS` (and the client's own limit) allows, and
/// resumes it with its outcome:
/// - `answered` with the response;
/// - `notProcessed` when the server provably did not act on it (it was never written,
///   the server refused the stream with `REFUSED_STREAM`, or its id is above the last one a
///   `GOAWAY` says was processed): the client sends it again elsewhere;
/// - `failed` otherwise: `.outcomeUnknown` when it was written and no answer came (a reset
///   stream, a broken connection, its deadline), `.cancelled` when its task was cancelled.
///
/// After a `GOAWAY` (or when the server did not choose `h2`), it takes no new exchange; the
/// ones under way finish, then the connection closes.
/// `@unchecked Sendable`: its session and streams are touched only on its loop's thread (the
/// `StreamDriver` contract); other threads reach it through its lock-guarded `shared` state.
final class HTTP2ClientConnection: StreamDriver, @unchecked Sendable {
    /// How an exchange ended.
    enum Outcome: Sendable {
        case answered(HTTPSClient.Response)
        case notProcessed(TransportError)
        case failed(TransportError)
    }

    struct Exchange {
        let id: UInt64
        let request: HTTP2Session.Message
        let deadline: ContinuousClock.Instant
        let complete: @Sendable (Outcome) -> Void
    }

    /// Why the connection ended without HTTP/2: the server chose another protocol by ALPN.
    struct HTTP2NotNegotiated: Error, CustomStringConvertible {
        let chosen: String?
        var description: String { "the server did not choose HTTP/2 (ALPN chose \(chosen ?? "nothing"))" }
    }

    /// What other threads read and write, under `shared`.
    private struct Shared {
        var queued: [Exchange] = []
        var cancelled: [UInt64] = []
        /// Exchanges queued or under way.
        var load = 0
        /// The streams it may have open at once (the server's limit, at most the client's).
        var streamLimit: Int
        var acceptsExchanges = true
        var ended = false
        /// Set once the handshake chose a protocol other than h2.
        var refusedHTTP2 = false
        /// `cancelAll()` was called: the loop resets every open stream.
        var cancelsAll = false
        var loop: StreamLoop?
    }

    private let shared: BlockingLock<Shared>
    private let maximumStreams: Int
    private let authority: String
    /// Called (on the loop's thread) with this connection when it can take more, or ended.
    private let onChange: @Sendable (HTTP2ClientConnection) -> Void

    /// An exchange whose request went out on a stream (the request itself is not kept).
    private struct OpenStream {
        let id: UInt64
        let deadline: ContinuousClock.Instant
        let complete: @Sendable (Outcome) -> Void
    }

    // Loop thread only.
    private var session: HTTP2Session?
    private var streams: [Int32: OpenStream] = [:]
    /// The streams by deadline: every exchange has the client's timeout and streams open
    /// in the order of their exchanges, so the earliest deadline is the first still open.
    private var deadlines = FIFO<(deadline: ContinuousClock.Instant, streamID: Int32)>()
    private var goAwayLastStreamID: Int32?
    private var closeRequested = false

    init(host: String, port: Int, context: TLSContext, connectTimeout: Duration, maximumStreams: Int,
         onChange: @escaping @Sendable (HTTP2ClientConnection) -> Void) throws(TransportError) {
        self.maximumStreams = maximumStreams
        self.authority = port == 443 ? host : "\(host):\(port)"
        self.onChange = onChange
        self.shared = BlockingLock(Shared(streamLimit: maximumStreams))
        let loop = try StreamLoop(name: "http2 \(host):\(port)", origin: .connect(host: host, port: port, timeout: connectTimeout),
                              tlsContext: context, role: .client(serverName: host), handshakeTimeout: connectTimeout,
                              outboundCapacity: 1 << 20, driver: self)
        shared.withLock { $0.loop = loop }
        loop.start()
    }

    // MARK: - From any thread

    /// At one moment, under one lock: whether it ended; whether it is retiring (it takes no
    /// new exchange: after a GOAWAY, a refused h2, or its end); its load (exchanges queued or
    /// under way); whether it takes another exchange now.
    var condition: (ended: Bool, retiring: Bool, load: Int, hasRoom: Bool) {
        shared.withLock { ($0.ended, !$0.acceptsExchanges, $0.load, $0.acceptsExchanges && $0.load < $0.streamLimit) }
    }

    var isEnded: Bool { shared.withLock { $0.ended } }

    /// True when the server chose a protocol other than h2.
    var refusedHTTP2: Bool { shared.withLock { $0.refusedHTTP2 } }

    /// Queues an exchange; false (nothing queued) when the connection takes no more.
    func enqueue(_ exchange: Exchange) -> Bool {
        let loop = shared.withLock { shared -> StreamLoop?? in
            guard shared.acceptsExchanges else { return .none }
            shared.queued.append(exchange)
            shared.load += 1
            return .some(shared.loop)
        }
        guard case .some(let loop) = loop else { return false }
        loop?.wake()
        return true
    }

    /// Ends the exchange `id` with `.cancelled` (its stream is reset if it was opened).
    func cancel(_ id: UInt64) {
        let (dequeued, loop) = shared.withLock { shared -> (Exchange?, StreamLoop?) in
            if let index = shared.queued.firstIndex(where: { $0.id == id }) {
                shared.load -= 1
                return (shared.queued.remove(at: index), nil)
            }
            shared.cancelled.append(id)
            return (nil, shared.loop)
        }
        dequeued?.complete(.failed(.cancelled))
        loop?.wake()
    }

    /// Ends with `.cancelled` the exchanges queued and not yet written to a stream (never
    /// sent); those under way go on.
    func cancelQueued() {
        _ = cancel(resettingStreams: false)
    }

    /// Ends every exchange it holds with `.cancelled` (their streams are reset).
    func cancelAll() {
        cancel(resettingStreams: true)?.wake()
    }

    /// Ends the queued exchanges with `.cancelled`; with `resettingStreams`, also tells the
    /// loop to reset every open stream (returned: the loop to wake).
    private func cancel(resettingStreams: Bool) -> StreamLoop? {
        let (dequeued, loop) = shared.withLock { shared -> ([Exchange], StreamLoop?) in
            let queued = shared.queued
            shared.queued.removeAll()
            shared.load -= queued.count
            if resettingStreams { shared.cancelsAll = true }
            return (queued, shared.loop)
        }
        for exchange in dequeued { exchange.complete(.failed(.cancelled)) }
        return resettingStreams ? loop : nil
    }

    /// Stops taking exchanges; the connection closes once those under way finished.
    func retire() {
        let loop = shared.withLock { shared -> StreamLoop? in
            shared.acceptsExchanges = false
            return shared.loop
        }
        loop?.wake()
    }

    // MARK: - StreamDriver (loop thread)

    func streamDidOpen(_ loop: StreamLoop) {
        guard loop.negotiatedProtocol == "h2" else {
            shared.withLock {
                $0.refusedHTTP2 = true
                $0.acceptsExchanges = false
            }
            loop.close(reason: HTTP2NotNegotiated(chosen: loop.negotiatedProtocol))
            return
        }
        do {
            session = try HTTP2Session(role: .client) { [unowned self] event in handle(event, loop: loop) }
        } catch {
            loop.abort(reason: error)
            return
        }
        pump(loop)
    }

    func stream(_ loop: StreamLoop, didRead bytes: UnsafeRawBufferPointer) {
        guard let session else { return }
        do {
            try session.receive(bytes)
        } catch {
            loop.abort(reason: error)
            return
        }
        pump(loop)
    }

    func streamDidWake(_ loop: StreamLoop) {
        pump(loop)
    }

    var wantsToRead: Bool { true }

    func nextDeadline(_ loop: StreamLoop) -> ContinuousClock.Instant? {
        while let first = deadlines.first, streams[first.streamID] == nil { _ = deadlines.popFirst() }
        return deadlines.first?.deadline
    }

    func streamDidEnd(_ loop: StreamLoop, reason: any Error) {
        let cause = reason as? TransportError ?? .connectionLost("\(reason)")
        let queued = shared.withLock { shared -> [Exchange] in
            shared.ended = true
            shared.acceptsExchanges = false
            shared.loop = nil
            shared.load = 0
            defer { shared.queued.removeAll() }
            return shared.queued
        }
        for exchange in queued { exchange.complete(.notProcessed(cause)) }
        for (streamID, exchange) in streams {
            if let last = goAwayLastStreamID, streamID > last {
                exchange.complete(.notProcessed(cause))
            } else if reason is HTTP2NotNegotiated {
                exchange.complete(.notProcessed(cause))
            } else {
                exchange.complete(.failed(.outcomeUnknown("\(cause)")))
            }
        }
        streams.removeAll()
        session = nil
        onChange(self)
    }

    // MARK: - The session's work

    /// Resets cancelled and late streams, opens streams for queued exchanges as the limit
    /// allows, and writes what the session has to send.
    private func pump(_ loop: StreamLoop) {
        guard let session, !loop.isEnded else { return }
        // No stream before the server's SETTINGS say how many it takes.
        let limit = session.hasPeerSettings ? min(maximumStreams, max(1, session.peerMaximumConcurrentStreams)) : 0
        let (cancelled, taken, accepting) = shared.withLock { shared -> ([UInt64], [Exchange], Bool) in
            shared.streamLimit = session.hasPeerSettings ? limit : maximumStreams
            var cancelled = shared.cancelled
            shared.cancelled.removeAll()
            if shared.cancelsAll {
                shared.cancelsAll = false
                cancelled += streams.values.map(\.id)
            }
            let room = max(0, limit - streams.count)
            let taken = Array(shared.queued.prefix(room))
            shared.queued.removeFirst(taken.count)
            return (cancelled, taken, shared.acceptsExchanges)
        }
        var finished = 0
        for id in cancelled {
            guard let (streamID, exchange) = streams.first(where: { $0.value.id == id }) else { continue }
            streams[streamID] = nil
            session.reset(streamID, errorCode: HTTP2Session.ErrorCode.cancel)
            exchange.complete(.failed(.cancelled))
            finished += 1
        }
        let now = ContinuousClock.now
        while let first = deadlines.first, first.deadline <= now || streams[first.streamID] == nil {
            _ = deadlines.popFirst()
            guard let stream = streams.removeValue(forKey: first.streamID) else { continue }
            session.reset(first.streamID, errorCode: HTTP2Session.ErrorCode.cancel)
            stream.complete(.failed(.outcomeUnknown("no answer in time")))
            finished += 1
        }
        var refused: [Exchange] = []
        for exchange in taken {
            do {
                let streamID = try session.submitRequest(exchange.request)
                streams[streamID] = OpenStream(id: exchange.id, deadline: exchange.deadline, complete: exchange.complete)
                deadlines.append((exchange.deadline, streamID))
            } catch {
                refused.append(exchange)
            }
        }
        if !refused.isEmpty {
            // No stream can be opened on this session any more: the others go elsewhere.
            shared.withLock { $0.acceptsExchanges = false }
            for exchange in refused { exchange.complete(.notProcessed(.connectionLost("no stream could be opened"))) }
            finished += refused.count
        }
        if finished > 0 { release(finished) }
        let bytes = session.output()
        if !bytes.isEmpty { loop.write(bytes: bytes, recordSize: StreamLoop.recordSize) }
        if !accepting || !refused.isEmpty {
            // Retiring: what is still queued cannot be sent here.
            let queued = shared.withLock { shared -> [Exchange] in
                defer { shared.queued.removeAll() }
                shared.load -= shared.queued.count
                return shared.queued
            }
            for exchange in queued { exchange.complete(.notProcessed(.connectionLost("the connection is closing"))) }
            if !queued.isEmpty { onChange(self) }
            if streams.isEmpty && !closeRequested {
                closeRequested = true
                session.goAway()
                let farewell = session.output()
                if !farewell.isEmpty { loop.write(bytes: farewell, recordSize: StreamLoop.recordSize) }
                loop.close(reason: TransportError.closedByPeer)
            }
        } else if !session.isAlive {
            loop.close(reason: TransportError.closedByPeer)
        }
    }

    private func release(_ count: Int) {
        shared.withLock { $0.load -= count }
        onChange(self)
    }

    private func handle(_ event: HTTP2Session.Event, loop: StreamLoop) {
        switch event {
        case .message(let streamID, let message):
            guard let exchange = streams.removeValue(forKey: streamID) else { return }
            var headers: [String: String] = [:]
            for (name, value) in message.headers where !name.hasPrefix(":") { headers[name] = value }
            let status = Int(message.header(":status") ?? "") ?? 0
            let body = String(decoding: message.body, as: UTF8.self)
            exchange.complete(.answered(HTTPSClient.Response(status: status, headers: headers, body: body)))
            release(1)
        case .streamClosed(let streamID, let errorCode):
            guard let exchange = streams.removeValue(forKey: streamID) else { return }
            if errorCode == HTTP2Session.ErrorCode.refusedStream || goAwayLastStreamID.map({ streamID > $0 }) == true {
                exchange.complete(.notProcessed(.connectionLost("the server refused the stream")))
            } else {
                exchange.complete(.failed(.outcomeUnknown("the server reset the stream (HTTP/2 error \(errorCode))")))
            }
            release(1)
        case .goAway(let lastStreamID, _):
            goAwayLastStreamID = lastStreamID
            shared.withLock { $0.acceptsExchanges = false }
            onChange(self)
        case .bodyTooLarge, .headersTooLarge:
            break  // a server's event
        }
    }
}
