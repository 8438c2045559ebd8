import Synchronization
import Runtime

/// A fixed number of connections, handed out one task at a time.
///
/// `withConnection` waits for a free connection (bounded: at most `size` are ever open),
/// opens one lazily, checks its health on the way out and back, and replaces broken ones.
/// Connecting failures surface to the caller as `.connection` errors; callers decide how
/// long to back off (the worker retries with exponential backoff until the database is back).
public final class PostgresPool: Sendable {
    private struct State {
        var idle: [PostgresConnection] = []
        var open = 0
        var waiters: [CheckedContinuation<Void, Never>] = []
        var closed = false
    }

    public let conninfo: String
    public let size: Int
    public let connectTimeout: Duration
    /// Whether its connections prepare statements (see `PostgresConnection.connect`).
    public let preparesStatements: Bool
    private let state = Mutex(State())

    public init(conninfo: String, size: Int, connectTimeout: Duration = .seconds(5), preparesStatements: Bool = true) {
        precondition(size > 0, "a pool needs at least one connection")
        self.conninfo = conninfo
        self.size = size
        self.connectTimeout = connectTimeout
        self.preparesStatements = preparesStatements
    }

    /// Runs `body` with a connection of its own.
    /// - Throws: `PostgresError` when no connection can be opened, or what `body` throws.
    public func withConnection<T: Sendable>(_ body: (PostgresConnection) async throws -> T) async throws -> T {
        let connection = try await checkOut()
        do {
            let value = try await body(connection)
            await checkIn(connection)
            return value
        } catch {
            await checkIn(connection)
            throw error
        }
    }

    /// Closes every idle connection and refuses new work.
    public func close() async {
        let (idle, waiters) = state.withLock { state -> ([PostgresConnection], [CheckedContinuation<Void, Never>]) in
            state.closed = true
            defer { state.idle.removeAll(); state.waiters.removeAll() }
            state.open -= state.idle.count
            return (state.idle, state.waiters)
        }
        for connection in idle { await connection.close() }
        for waiter in waiters { waiter.resume() }
    }

    private enum Slot { case reuse(PostgresConnection), openNew, wait }

    private func checkOut() async throws -> PostgresConnection {
        while true {
            let slot = try state.withLock { state throws -> Slot in
                if state.closed { throw PostgresError(kind: .connection, message: "the pool is closed") }
                if let connection = state.idle.popLast() { return .reuse(connection) }
                if state.open < size {
                    state.open += 1
                    return .openNew
                }
                return .wait
            }
            switch slot {
            case .reuse(let connection):
                if connection.isHealthy { return connection }
                await discard(connection)
            case .openNew:
                do {
                    return try await PostgresConnection.connect(conninfo, timeout: connectTimeout, preparesStatements: preparesStatements)
                } catch {
                    release()
                    throw error
                }
            case .wait:
                await withCheckedContinuation { continuation in
                    let ready = state.withLock { state -> Bool in
                        if state.closed || !state.idle.isEmpty || state.open < size { return true }
                        state.waiters.append(continuation)
                        return false
                    }
                    if ready { continuation.resume() }
                }
            }
        }
    }

    private func checkIn(_ connection: PostgresConnection) async {
        // A borrower that left a transaction open (or failed inside one without rolling
        // back) must not hand it to the next: roll it back, or replace the connection.
        if connection.isHealthy && !connection.isOutsideTransaction {
            if (try? await connection.execute("ROLLBACK")) == nil || !connection.isOutsideTransaction {
                await discard(connection)
                return
            }
        }
        guard connection.isHealthy else {
            await discard(connection)
            return
        }
        let (waiter, closeIt) = state.withLock { state -> (CheckedContinuation<Void, Never>?, Bool) in
            if state.closed {
                state.open -= 1
                return (nil, true)
            }
            state.idle.append(connection)
            return (state.waiters.isEmpty ? nil : state.waiters.removeFirst(), false)
        }
        if closeIt { await connection.close() }
        waiter?.resume()
    }

    private func discard(_ connection: PostgresConnection) async {
        await connection.close()
        release()
    }

    /// Gives back a slot of `open` and wakes one waiter to use it.
    private func release() {
        let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
            state.open -= 1
            return state.waiters.isEmpty ? nil : state.waiters.removeFirst()
        }
        waiter?.resume()
    }
}
