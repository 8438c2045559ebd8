import Foundation
import Runtime
import Synchronization

/// An HTTPS client for one origin over HTTP/2: many requests share each connection as
/// concurrent streams (up to the server's `SETTINGS_MAX_CONCURRENT_STREAMS` and
/// `maximumStreamsPerConnection`), over at most `maximumConnections` connections, opened
/// as the load needs them. Requests beyond that wait, in order, for a stream.
///
/// It offers `h2` by ALPN; a server that chooses HTTP/1.1 instead is served from then on by
/// an `HTTPSClient` (keep-alive, one request per connection at a time), said once in
/// `fellBackToHTTP1`.
///
/// A request is sent again only when the server provably did not act on it: it was never
/// written, the server refused its stream (`REFUSED_STREAM`), or a `GOAWAY` announced a last
/// processed stream below it. Then it goes to another connection (a `GOAWAY`ed connection
/// takes no new stream, and closes when its streams finished). A stream the server reset
/// otherwise, a connection that broke, or a request left unanswered past `timeout` ends with
/// `.outcomeUnknown` (counted in `outcomeUnknownCount`): the caller decides whether to send
/// it again.
///
/// Two ways to send: `send` awaits the response (cancelling the task resets its stream and
/// throws `.cancelled`); `submit` returns at once and hands the outcome to a completion
/// that runs on the connection's thread, without a task per request (the outbox's v1
/// transport keeps thousands of requests in flight that way).
public final class HTTP2Client: Sendable {
    /// What a request came to.
    public typealias Completion = @Sendable (Result<HTTPSClient.Response, TransportError>) -> Void

    public let host: String
    public let port: Int
    public let maximumConnections: Int
    public let maximumStreamsPerConnection: Int
    public let timeout: Duration
    private let context: TLSContext
    private let connectTimeout: Duration
    private let trust: TLSTrust
    private let authority: String
    private let state = BlockingLock(State())
    private let outcomeUnknown = Atomic(0)
    private let exchangeIDs = Atomic<UInt64>(0)

    /// A request not answered yet, and how many times a server did not process it.
    private struct Pending: Sendable {
        let id: UInt64
        let request: HTTP2Session.Message
        var refusals: Int
        let complete: Completion

        /// The request as HTTP/1.1 takes it (the server refused h2).
        var http1: (method: String, path: String, headers: [String: String]) {
            var headers: [String: String] = [:]
            for (name, value) in request.headers where !name.hasPrefix(":") && name != "content-length" { headers[name] = value }
            return (request.header(":method") ?? "POST", request.header(":path") ?? "/", headers)
        }
    }

    private struct State {
        var connections: [HTTP2ClientConnection] = []
        /// Requests waiting for a stream, oldest first.
        var waiting = FIFO<Pending>()
        var fallback: HTTPSClient?
    }

    /// A server that refuses every stream it is sent ends a request after this many tries.
    private static let maximumRefusals = 4

    /// - Parameters:
    ///   - trust: how the server's certificate is verified.
    ///   - timeout: for one request, from its stream's opening to the end of the response.
    public init(host: String, port: Int, trust: TLSTrust, maximumConnections: Int = 2, maximumStreamsPerConnection: Int = 100,
                timeout: Duration = .seconds(30), connectTimeout: Duration = .seconds(10)) throws(TransportError) {
        precondition(maximumConnections > 0 && maximumStreamsPerConnection > 0)
        self.host = host
        self.port = port
        self.trust = trust
        self.authority = port == 443 ? host : "\(host):\(port)"
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

    /// Ends with `.cancelled` every request not sent yet (waiting for a stream, or queued on
    /// a connection and not yet written): a shutdown stops sending before it waits for the
    /// answers to what is under way, which go on.
    public func cancelUnsent() {
        for connection in cancelWaiting() { connection.cancelQueued() }
    }

    /// Ends every request under way or waiting with `.cancelled` (streams reset).
    public func cancelAll() {
        for connection in cancelWaiting() { connection.cancelAll() }
    }

    /// Ends the requests waiting for a stream with `.cancelled`; returns the connections.
    private func cancelWaiting() -> [HTTP2ClientConnection] {
        let (connections, waiting) = state.withLock { state -> ([HTTP2ClientConnection], [Pending]) in
            defer { state.waiting = FIFO() }
            return (state.connections, state.waiting.elements)
        }
        for pending in waiting { pending.complete(.failure(.cancelled)) }
        return connections
    }

    /// Sends one request and returns the response.
    /// - Throws: `TransportError`: for connection and TLS failures, `.outcomeUnknown` when the
    ///   request may have been processed, `.cancelled`.
    public func send(method: String, path: String, headers: [String: String], body: [UInt8]) async throws -> HTTPSClient.Response {
        try await send(method: method, path: path, headers: headers.map { ($0.key, $0.value) }, body: body)
    }

    /// Sends one request and returns the response; `headers` in the order given.
    /// - Throws: `TransportError`: for connection and TLS failures, `.outcomeUnknown` when the
    ///   request may have been processed, `.cancelled`.
    public func send(method: String, path: String, headers: [(name: String, value: String)], body: [UInt8]) async throws -> HTTPSClient.Response {
        if Task.isCancelled { throw TransportError.cancelled }
        let id = exchangeIDs.add(1, ordering: .relaxed).newValue
        let result = await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Result<HTTPSClient.Response, TransportError>, Never>) in
                dispatch(pending(id: id, method: method, path: path, headers: headers, body: body) { continuation.resume(returning: $0) })
            }
        } onCancel: {
            cancel(id)
        }
        return try result.get()
    }

    /// Sends one request without waiting: `complete` runs once with its outcome, on a
    /// connection's thread (it must not block).
    public func submit(method: String, path: String, headers: [(name: String, value: String)], body: [UInt8], complete: @escaping Completion) {
        dispatch(pending(id: exchangeIDs.add(1, ordering: .relaxed).newValue, method: method, path: path, headers: headers, body: body,
                         complete: complete))
    }

    private func pending(id: UInt64, method: String, path: String, headers: [(name: String, value: String)], body: [UInt8],
                         complete: @escaping Completion) -> Pending {
        var requestHeaders: [(name: String, value: String)] = []
        requestHeaders.reserveCapacity(headers.count + 5)
        requestHeaders.append((":method", method))
        requestHeaders.append((":scheme", "https"))
        requestHeaders.append((":authority", authority))
        requestHeaders.append((":path", path))
        for (name, value) in headers {
            let lowered = name.utf8.contains(where: { (65...90).contains($0) }) ? name.lowercased() : name
            // Connection-specific headers have no place in HTTP/2.
            switch lowered {
            case "host", "connection", "content-length", "transfer-encoding", "keep-alive": continue
            default: requestHeaders.append((lowered, value))
            }
        }
        requestHeaders.append(("content-length", String(body.count)))
        let request = HTTP2Session.Message(headers: requestHeaders, body: body)
        return Pending(id: id, request: request, refusals: 0, complete: complete)
    }

    /// Hands a request to a connection with room (opened if needed), or queues it.
    private func dispatch(_ pending: Pending) {
        enum Route { case connection(HTTP2ClientConnection), fallback(HTTPSClient), queued, failed(TransportError) }
        let route = state.withLock { state -> Route in
            if let fallback = state.fallback { return .fallback(fallback) }
            do throws(TransportError) {
                if let connection = try connectionWithRoom(&state) { return .connection(connection) }
            } catch {
                return .failed(error)
            }
            state.waiting.append(pending)
            return .queued
        }
        switch route {
        case .connection(let connection): enqueue(pending, on: connection)
        case .fallback(let fallback): send(pending, over: fallback)
        case .queued: break
        case .failed(let error): pending.complete(.failure(error))
        }
    }

    /// The least loaded live connection with room, or a new one if the limit allows; under
    /// the lock, so that two callers never open one each past the limit.
    /// - Throws: `TransportError` when no connection can be made now (out of descriptors).
    private func connectionWithRoom(_ state: inout State) throws(TransportError) -> HTTP2ClientConnection? {
        var best: HTTP2ClientConnection?
        var bestLoad = Int.max
        var live = 0
        var anyEnded = false
        for connection in state.connections {
            let condition = connection.condition
            if condition.ended { anyEnded = true }
            guard !condition.retiring else { continue }
            live += 1
            if condition.load < bestLoad && condition.hasRoom {
                best = connection
                bestLoad = condition.load
            }
        }
        if anyEnded { state.connections.removeAll { $0.isEnded } }
        if let best { return best }
        guard live < maximumConnections else { return nil }
        let connection = try HTTP2ClientConnection(host: host, port: port, context: context, connectTimeout: connectTimeout,
                                               maximumStreams: maximumStreamsPerConnection) { [weak self] in self?.connectionChanged($0) }
        state.connections.append(connection)
        return connection
    }

    private func enqueue(_ pending: Pending, on connection: HTTP2ClientConnection) {
        let exchange = HTTP2ClientConnection.Exchange(id: pending.id, request: pending.request, deadline: .now + timeout) { [weak self] outcome in
            self?.finish(pending, outcome: outcome, on: connection)
        }
        if !connection.enqueue(exchange) { redispatch(pending, after: .connectionLost("the connection is closing"), on: connection) }
    }

    private func finish(_ pending: Pending, outcome: HTTP2ClientConnection.Outcome, on connection: HTTP2ClientConnection) {
        switch outcome {
        case .answered(let response):
            pending.complete(.success(response))
        case .failed(let error):
            if error.isOutcomeUnknown { outcomeUnknown.add(1, ordering: .relaxed) }
            pending.complete(.failure(error))
        case .notProcessed(let reason):
            redispatch(pending, after: reason, on: connection)
        }
    }

    /// A request the server did not process goes to another connection (or over HTTP/1.1
    /// if the server refused h2), up to `maximumRefusals` times.
    private func redispatch(_ pending: Pending, after reason: TransportError, on connection: HTTP2ClientConnection) {
        if connection.refusedHTTP2 { fallBack() }
        var again = pending
        again.refusals += 1
        guard again.refusals < Self.maximumRefusals else {
            pending.complete(.failure(reason))
            return
        }
        dispatch(again)
    }

    private func send(_ pending: Pending, over fallback: HTTPSClient) {
        // HTTP/1.1 is the rare path: a task per request there.
        Task {
            do {
                let request = pending.http1
                pending.complete(.success(try await fallback.send(method: request.method, path: request.path, headers: request.headers,
                                                                  body: pending.request.body)))
            } catch let error as TransportError {
                pending.complete(.failure(error))
            } catch {
                pending.complete(.failure(.connectionLost("\(error)")))
            }
        }
    }

    /// Ends the request `id` with `.cancelled`, wherever it is.
    private func cancel(_ id: UInt64) {
        let (waiting, connections) = state.withLock { state -> (Pending?, [HTTP2ClientConnection]) in
            var found: Pending?
            var kept = FIFO<Pending>()
            while let pending = state.waiting.popFirst() {
                if pending.id == id { found = pending } else { kept.append(pending) }
            }
            state.waiting = kept
            return (found, found == nil ? state.connections : [])
        }
        if let waiting { waiting.complete(.failure(.cancelled)) }
        for connection in connections { connection.cancel(id) }
    }

    /// A connection made room, retired or ended: waiting requests move to connections with
    /// room (a new one opened if the limit allows), first to `changed` while it has room (its
    /// own thread calls this: the request is taken up there without waking another thread).
    private func connectionChanged(_ changed: HTTP2ClientConnection? = nil) {
        while true {
            enum Next {
                case connection(Pending, HTTP2ClientConnection), fallback(Pending, HTTPSClient), failed(Pending, TransportError), none
            }
            let next = state.withLock { state -> Next in
                guard let pending = state.waiting.first else { return .none }
                if let fallback = state.fallback {
                    _ = state.waiting.popFirst()
                    return .fallback(pending, fallback)
                }
                let preferred = changed.flatMap { $0.condition.hasRoom ? $0 : nil }
                let connection: HTTP2ClientConnection?
                do throws(TransportError) {
                    if let preferred { connection = preferred } else { connection = try connectionWithRoom(&state) }
                } catch {
                    _ = state.waiting.popFirst()
                    return .failed(pending, error)
                }
                guard let connection else { return .none }
                _ = state.waiting.popFirst()
                return .connection(pending, connection)
            }
            switch next {
            case .connection(let pending, let connection): enqueue(pending, on: connection)
            case .fallback(let pending, let fallback): send(pending, over: fallback)
            case .failed(let pending, let error): pending.complete(.failure(error))
            case .none: return
            }
        }
    }

    /// From now on, requests go over HTTP/1.1.
    private func fallBack() {
        let created = try? HTTPSClient(host: host, port: port, trust: trust, maximumConnections: maximumConnections, timeout: timeout)
        state.withLock { state in
            if state.fallback == nil { state.fallback = created }
        }
        connectionChanged()
    }
}
