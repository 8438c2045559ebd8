import Foundation
import Runtime
import Synchronization

/// An HTTPS client for one origin over HTTP/2: many requests share each connection as
/// concurrent streams (up to the server's `SETTINGS_MAX_CONCURRENT_STREAMS` and
/// `maximumStreamsPerConnection`), over at most `maximumConnections` connections, opened
/// as the load needs them. Callers beyond that wait for a stream.
///
/// It offers `h2` by ALPN; a server that chooses HTTP/1.1 instead is served from then on by
/// an `HTTPSClient` (keep-alive, one request per connection at a time), said once in
/// `fellBackToHTTP1`.
///
/// A request is sent again only when the server provably did not act on it: it was never
/// written, the server refused its stream (`REFUSED_STREAM`), or a `GOAWAY` announced a last
/// processed stream below it. Then it goes to another connection (a `GOAWAY`ed connection
/// takes no new stream, and closes when its streams finished). A stream the server reset
/// otherwise, a connection that broke, or a request left unanswered past `timeout` throws
/// `.outcomeUnknown` (counted in `outcomeUnknownCount`): the caller decides whether to send
/// it again. Cancelling the calling task resets its stream and throws `.cancelled`.
public final class HTTP2Client: Sendable {
    public let host: String
    public let port: Int
    public let maximumConnections: Int
    public let maximumStreamsPerConnection: Int
    public let timeout: Duration
    private let context: TLSContext
    private let connectTimeout: Duration
    private let trust: TLSTrust
    private let state = BlockingLock(State())
    private let outcomeUnknown = Atomic(0)
    private let exchangeIDs = Atomic<UInt64>(0)

    private struct State {
        var connections: [HTTP2ClientConnection] = []
        var waiters = Waiters<Bool>()
        var fallback: HTTPSClient?
        var closed = false
    }

    /// - Parameters:
    ///   - trust: how the server's certificate is verified.
    ///   - timeout: for one request, from its stream's opening to the end of the response.
    public init(host: String, port: Int, trust: TLSTrust, maximumConnections: Int = 2, maximumStreamsPerConnection: Int = 100,
                timeout: Duration = .seconds(30), connectTimeout: Duration = .seconds(10)) throws(TransportError) {
        precondition(maximumConnections > 0 && maximumStreamsPerConnection > 0)
        self.host = host
        self.port = port
        self.trust = trust
        self.maximumConnections = maximumConnections
        self.maximumStreamsPerConnection = maximumStreamsPerConnection
        self.timeout = timeout
        self.connectTimeout = connectTimeout
        self.context = try TLSContext.client(trust: trust, protocols: ["h2", "http/1.1"])
    }

    deinit {
        for connection in state.withLock({ $0.connections }) { connection.retire() }
    }

    /// Requests whose stream or connection broke after they were sent, before an answer.
    public var outcomeUnknownCount: Int {
        outcomeUnknown.load(ordering: .relaxed) + (state.withLock { $0.fallback }?.outcomeUnknownCount ?? 0)
    }

    /// True once the server chose HTTP/1.1: requests go over `HTTPSClient` connections.
    public var fellBackToHTTP1: Bool { state.withLock { $0.fallback != nil } }

    /// The connections open now (HTTP/2 only).
    public var openConnections: Int { state.withLock { $0.connections.filter { !$0.isEnded }.count } }

    /// Closes every connection once its streams finished; later requests open new ones.
    public func closeIdleConnections() {
        for connection in state.withLock({ $0.connections }) { connection.retire() }
    }

    /// Sends one request and returns the response.
    /// - Throws: `TransportError`: for connection and TLS failures, `.outcomeUnknown` when the
    ///   request may have been processed, `.cancelled`.
    public func send(method: String, path: String, headers: [String: String], body: [UInt8]) async throws -> HTTPSClient.Response {
        var request = HTTP2Session.Message(headers: [(":method", method), (":scheme", "https"),
                                                     (":authority", port == 443 ? host : "\(host):\(port)"), (":path", path)],
                                           body: body)
        request.headers.reserveCapacity(headers.count + 5)
        for (name, value) in headers {
            let lowered = name.utf8.contains(where: { (65...90).contains($0) }) ? name.lowercased() : name
            // Connection-specific headers have no place in HTTP/2.
            switch lowered {
            case "host", "connection", "content-length", "transfer-encoding", "keep-alive": continue
            default: request.headers.append((lowered, value))
            }
        }
        request.headers.append(("content-length", String(body.count)))
        var lastRefusal: TransportError?
        // A request the server did not process goes to another connection; a server that
        // refuses every stream it is sent ends this after a few tries.
        for _ in 0..<4 {
            if Task.isCancelled { throw TransportError.cancelled }
            if let fallback = state.withLock({ $0.fallback }) {
                return try await fallback.send(method: method, path: path, headers: headers, body: body)
            }
            guard let connection = await connectionWithRoom() else {
                if Task.isCancelled { throw TransportError.cancelled }
                continue  // fell back to HTTP/1.1 meanwhile
            }
            let id = exchangeIDs.add(1, ordering: .relaxed).newValue
            let deadline = ContinuousClock.now + timeout
            let outcome = await withTaskCancellationHandler {
                await withCheckedContinuation { (continuation: CheckedContinuation<HTTP2ClientConnection.Outcome, Never>) in
                    if !connection.enqueue(.init(id: id, request: request, deadline: deadline, continuation: continuation)) {
                        continuation.resume(returning: .notProcessed(.connectionLost("the connection is closing")))
                    }
                }
            } onCancel: {
                connection.cancel(id)
            }
            switch outcome {
            case .answered(let response):
                return response
            case .failed(let error):
                if error.isOutcomeUnknown { outcomeUnknown.add(1, ordering: .relaxed) }
                throw error
            case .notProcessed(let reason):
                if connection.refusedHTTP2 { fallBack() }
                lastRefusal = reason
            }
        }
        throw lastRefusal ?? TransportError.connectionLost("the server processed none of the attempts")
    }

    /// A connection that takes another stream now, opened if needed; nil when the task was
    /// cancelled while waiting for one.
    private func connectionWithRoom() async -> HTTP2ClientConnection? {
        while !Task.isCancelled {
            if state.withLock({ $0.fallback != nil }) { return nil }
            let found = state.withLock { state -> HTTP2ClientConnection? in
                state.connections.removeAll { $0.isEnded }
                let live = state.connections.filter { !$0.isRetiring }
                if let best = live.filter(\.hasRoom).min(by: { $0.load < $1.load }) { return best }
                guard live.count < maximumConnections else { return nil }
                // Opened under the lock, so that two callers never open one each past the limit.
                let connection = HTTP2ClientConnection(host: host, port: port, context: context, connectTimeout: connectTimeout,
                                                       maximumStreams: maximumStreamsPerConnection) { [weak self] in self?.connectionChanged() }
                state.connections.append(connection)
                return connection
            }
            switch found {
            case let connection?:
                return connection
            case .none:
                _ = await state.suspend(in: \.waiters, cancelled: false) { state in
                    state.connections.contains { $0.isEnded || ($0.hasRoom && !$0.isRetiring) }
                        || state.connections.filter({ !$0.isRetiring }).count < maximumConnections ? true : nil
                }
            }
        }
        return nil
    }

    /// A connection made room, retired or ended: the tasks waiting for one look again.
    private func connectionChanged() {
        let waiters = state.withLock { $0.waiters.removeAll() }
        for waiter in waiters { waiter.resume(returning: true) }
    }

    /// From now on, requests go over HTTP/1.1.
    private func fallBack() {
        let created = try? HTTPSClient(host: host, port: port, trust: trust, maximumConnections: maximumConnections, timeout: timeout)
        let waiters = state.withLock { state -> [CheckedContinuation<Bool, Never>] in
            if state.fallback == nil { state.fallback = created }
            return state.waiters.removeAll()
        }
        for waiter in waiters { waiter.resume(returning: true) }
    }
}
