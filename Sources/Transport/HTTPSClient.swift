import Foundation
import Synchronization
import Runtime

/// A small HTTPS/1.1 client for one origin: connections are reused (keep-alive), at most
/// `maximumConnections` requests are in flight (callers beyond that wait), and every
/// blocking call runs on the connection's own thread, never on the cooperative pool.
public final class HTTPSClient: Sendable {
    /// A response: status, headers (names lower-cased) and body text.
    public struct Response: Sendable, Equatable {
        public let status: Int
        public let headers: [String: String]
        public let body: String
    }

    /// One kept-alive connection and its thread.
    private final class Connection: @unchecked Sendable {
        // Touched only on `thread` (the channel) or under the client's lock (hand-over).
        let thread: DedicatedThread
        var channel: TLSChannel?

        init(thread: DedicatedThread) { self.thread = thread }
    }

    private struct State {
        var idle: [Connection] = []
        var open = 0
        var waiters: [CheckedContinuation<Void, Never>] = []
    }

    public let host: String
    public let port: Int
    public let maximumConnections: Int
    public let timeout: Duration
    private let context: TLSContext
    private let state = Mutex(State())

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

    /// Sends one request and returns the response.
    /// - Throws: `TransportError` for connection, TLS and timeout failures (`.timedOut`).
    public func send(method: String, path: String, headers: [String: String], body: [UInt8]) async throws -> Response {
        let connection = await checkOut()
        let request = HTTPMessage(startLine: [method, path, "HTTP/1.1"],
                                  headers: headers.reduce(into: ["host": "\(host):\(port)"]) { $0[$1.key.lowercased()] = $1.value },
                                  body: body)
        let (host, port, context, timeout) = (self.host, self.port, self.context, self.timeout)
        do {
            let response = try await connection.thread.run { () throws -> HTTPMessage in
                try Self.exchange(request, on: connection, host: host, port: port, context: context, timeout: timeout)
            }
            checkIn(connection, reusable: response.keepsAlive)
            return Response(status: response.status, headers: response.headers, body: response.bodyText)
        } catch {
            checkIn(connection, reusable: false)
            throw error
        }
    }

    /// Runs on the connection's thread. A kept-alive connection the server closed meanwhile
    /// is replaced once, transparently.
    private static func exchange(_ request: HTTPMessage, on connection: Connection, host: String, port: Int,
                                 context: TLSContext, timeout: Duration) throws -> HTTPMessage {
        let deadline = ContinuousClock.now + timeout
        let reused = connection.channel != nil
        do {
            return try roundTrip(request, on: connection, host: host, port: port, context: context, deadline: deadline)
        } catch let error as TransportError where reused {
            guard case .connectionLost = error else { throw error }
            connection.channel = nil
            return try roundTrip(request, on: connection, host: host, port: port, context: context, deadline: deadline)
        }
    }

    private static func roundTrip(_ request: HTTPMessage, on connection: Connection, host: String, port: Int,
                                  context: TLSContext, deadline: ContinuousClock.Instant) throws -> HTTPMessage {
        let channel = try connection.channel ?? TLSChannel.connect(host: host, port: port, context: context, deadline: deadline)
        connection.channel = channel
        try channel.write(request.serialized(), until: deadline)
        var reader = HTTPMessageReader()
        var buffer = [UInt8](repeating: 0, count: 16 << 10)
        while true {
            if let response = try reader.next() {
                if !response.keepsAlive {
                    channel.close()
                    connection.channel = nil
                }
                return response
            }
            let count = try channel.read(into: &buffer, until: deadline)
            if count == 0 {
                connection.channel = nil
                throw TransportError.connectionLost("the server closed the connection before the end of the response")
            }
            reader.append(buffer[..<count])
        }
    }

    private func checkOut() async -> Connection {
        while true {
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
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    let wait = state.withLock { state -> Bool in
                        guard state.idle.isEmpty, state.open >= maximumConnections else { return false }
                        state.waiters.append(continuation)
                        return true
                    }
                    if !wait { continuation.resume() }
                }
            }
        }
    }

    private func checkIn(_ connection: Connection, reusable: Bool) {
        let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
            if reusable {
                state.idle.append(connection)
            } else {
                state.open -= 1
            }
            return state.waiters.isEmpty ? nil : state.waiters.removeFirst()
        }
        if !reusable {
            let thread = connection.thread
            thread.submit { connection.channel = nil }
            thread.shutdown()
        }
        waiter?.resume()
    }
}
