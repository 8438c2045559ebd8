import Foundation
import Runtime
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A small HTTPS/1.1 client for one origin: connections are reused (keep-alive), at most
/// `maximumConnections` requests are in flight (callers beyond that wait), and every
/// blocking call runs on the connection's own thread, never on the cooperative pool.
///
/// A request goes out once: it is sent again on a fresh connection only when it provably
/// did not reach the server (the kept-alive connection was found closed before writing,
/// or the write failed). When the connection breaks after the whole request was written
/// and before the answer, the outcome is unknown and `send` throws `.outcomeUnknown`
/// (counted in `outcomeUnknownCount`). Cancelling the calling task ends the exchange at
/// once with `.cancelled`.
public final class HTTPSClient: Sendable {
    /// A response: status, headers (names lower-cased) and body text.
    public struct Response: Sendable, Equatable {
        public let status: Int
        public let headers: [String: String]
        public let body: String
    }

    /// One kept-alive connection and its thread. `@unchecked Sendable`: its channel is touched
    /// only on its thread, its hand-over state only under the client's lock.
    private final class Connection: @unchecked Sendable {
        // Touched only on `thread` (the channel) or under the client's lock (hand-over).
        let thread: DedicatedThread
        var channel: TLSChannel?
        /// The socket of the exchange under way, for `interrupt()` from another thread.
        let active = BlockingLock<(fd: Int32?, interrupted: Bool)>((nil, false))

        init(thread: DedicatedThread) { self.thread = thread }

        /// Ends a blocked exchange: its socket is shut down, so its wait returns.
        func interrupt() {
            active.withLock { active in
                active.interrupted = true
                if let fd = active.fd { _ = shutdown(fd, Int32(SHUT_RDWR)) }
            }
        }
    }

    private struct State {
        var idle: [Connection] = []
        var open = 0
        var waiters = Waiters<Bool>()
    }

    public let host: String
    public let port: Int
    public let maximumConnections: Int
    public let timeout: Duration
    private let context: TLSContext
    private let state = BlockingLock(State())
    private let outcomeUnknown = Atomic(0)

    /// - Parameters:
    ///   - trust: how the server's certificate is verified (as for XMPP).
    ///   - timeout: for one request, from connecting to the end of the response.
    public init(host: String, port: Int, trust: TLSTrust, maximumConnections: Int = 4, timeout: Duration = .seconds(30)) throws(TransportError) {
        precondition(maximumConnections > 0)
        self.host = host
        self.port = port
        self.maximumConnections = maximumConnections
        self.timeout = timeout
        self.context = try TLSContext.client(trust: trust)
    }

    deinit {
        for connection in state.withLock({ $0.idle }) { connection.thread.shutdown() }
    }

    /// Requests whose connection broke after they were sent, before any answer.
    public var outcomeUnknownCount: Int { outcomeUnknown.load(ordering: .relaxed) }

    /// Sends one request and returns the response.
    /// - Throws: `TransportError` for connection, TLS and timeout failures (`.timedOut`),
    ///   `.outcomeUnknown` when the request may have been processed, `.cancelled`.
    public func send(method: String, path: String, headers: [String: String], body: [UInt8]) async throws -> Response {
        guard let connection = await checkOut() else { throw TransportError.cancelled }
        let request = HTTPMessage(startLine: [method, path, "HTTP/1.1"],
                                  headers: headers.reduce(into: ["host": "\(host):\(port)"]) { $0[$1.key.lowercased()] = $1.value },
                                  body: body)
        let (host, port, context, timeout) = (self.host, self.port, self.context, self.timeout)
        do {
            let response = try await withTaskCancellationHandler {
                try await connection.thread.run { () throws -> HTTPMessage in
                    try Self.exchange(request, on: connection, host: host, port: port, context: context, timeout: timeout)
                }
            } onCancel: {
                connection.interrupt()
            }
            checkIn(connection, reusable: response.keepsAlive)
            return Response(status: response.status, headers: response.headers, body: response.bodyText)
        } catch {
            checkIn(connection, reusable: false)
            if case .outcomeUnknown? = error as? TransportError { outcomeUnknown.add(1, ordering: .relaxed) }
            throw error
        }
    }

    /// Runs on the connection's thread. A kept-alive connection the server closed meanwhile
    /// is replaced before the request is written; a write that fails on it is retried once
    /// on a new connection (the server cannot have processed a request it did not get).
    private static func exchange(_ request: HTTPMessage, on connection: Connection, host: String, port: Int,
                                 context: TLSContext, timeout: Duration) throws -> HTTPMessage {
        let deadline = ContinuousClock.now + timeout
        if let channel = connection.channel, channel.peerHasClosed() { connection.channel = nil }
        let reused = connection.channel != nil
        let bytes = request.serialized()
        let channel = try written(bytes, on: connection, reused: reused, host: host, port: port, context: context, deadline: deadline)
        defer { connection.active.withLock { $0.fd = nil } }
        var reader = HTTPMessageReader()
        var buffer = [UInt8](repeating: 0, count: 16 << 10)
        var answered = false
        while true {
            if let response = try reader.next() {
                if !response.keepsAlive { release(connection) }
                return response
            }
            let count: Int
            do {
                count = try channel.read(into: &buffer, until: deadline)
            } catch {
                release(connection)
                if connection.active.withLock({ $0.interrupted }) { throw TransportError.cancelled }
                throw error
            }
            if count == 0 {
                release(connection)
                if connection.active.withLock({ $0.interrupted }) { throw TransportError.cancelled }
                throw answered ? TransportError.connectionLost("the server closed the connection before the end of the response")
                               : TransportError.outcomeUnknown("the server closed the connection after the request was sent")
            }
            answered = true
            reader.append(buffer[..<count])
        }
    }

    /// Writes `bytes` on the connection's channel; when that fails on a reused connection,
    /// once more on a new one. Returns the channel they were written on.
    private static func written(_ bytes: [UInt8], on connection: Connection, reused: Bool, host: String, port: Int,
                                context: TLSContext, deadline: ContinuousClock.Instant) throws -> TLSChannel {
        let first = try open(connection, host: host, port: port, context: context, deadline: deadline)
        var failure: TransportError
        do {
            try first.write(bytes, until: deadline)
            return first
        } catch {
            failure = error
        }
        let interrupted = connection.active.withLock { $0.interrupted }
        guard reused, !interrupted, case .connectionLost = failure else { throw failure }
        release(connection)
        let second = try open(connection, host: host, port: port, context: context, deadline: deadline)
        try second.write(bytes, until: deadline)
        return second
    }

    /// The connection's channel, connected now if needed; its socket is registered for
    /// `interrupt()`.
    private static func open(_ connection: Connection, host: String, port: Int, context: TLSContext,
                             deadline: ContinuousClock.Instant) throws -> TLSChannel {
        if connection.active.withLock({ $0.interrupted }) { throw TransportError.cancelled }
        let channel = try connection.channel ?? TLSChannel.connect(host: host, port: port, context: context, deadline: deadline)
        connection.channel = channel
        let interrupted = connection.active.withLock { active -> Bool in
            active.fd = channel.fd
            return active.interrupted
        }
        if interrupted { _ = shutdown(channel.fd, Int32(SHUT_RDWR)) }
        return channel
    }

    /// Drops the connection's channel (its socket closes), after `interrupt()` can no
    /// longer reach it.
    private static func release(_ connection: Connection) {
        connection.active.withLock { $0.fd = nil }
        connection.channel?.close()
        connection.channel = nil
    }

    /// A connection of its own, or nil when the task was cancelled while waiting for one.
    private func checkOut() async -> Connection? {
        while true {
            if Task.isCancelled { return nil }
            let taken = state.withLock { state -> Connection?? in
                if let connection = state.idle.popLast() { return .some(connection) }
                if state.open < maximumConnections {
                    state.open += 1
                    return .some(nil)
                }
                return .none
            }
            switch taken {
            case .some(let connection?): return connection
            case .some(nil): return Connection(thread: DedicatedThread(name: "https \(host):\(port)"))
            case .none:
                _ = await suspendForConnection()
            }
        }
    }

    private func suspendForConnection() async -> Bool {
        await state.suspend(in: \.waiters, cancelled: false) { state in
            !state.idle.isEmpty || state.open < maximumConnections ? true : nil
        }
    }

    private func checkIn(_ connection: Connection, reusable: Bool) {
        connection.active.withLock { $0 = (nil, false) }
        let waiter = state.withLock { state -> CheckedContinuation<Bool, Never>? in
            if reusable {
                state.idle.append(connection)
            } else {
                state.open -= 1
            }
            return state.waiters.removeFirst()
        }
        if !reusable {
            let thread = connection.thread
            thread.submit { connection.channel = nil }
            thread.shutdown()
        }
        waiter?.resume(returning: true)
    }
}
