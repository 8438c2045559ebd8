import Runtime

/// A fixed number of connections, handed out one task at a time.
///
/// `withConnection` waits for a free connection (bounded: at most `size` are ever open),
/// opens one lazily, checks its health on the way out and back, and replaces broken ones
/// (a call that missed its deadline or was cancelled breaks its connection). Connecting
/// failures surface to the caller as `.connection` errors; callers decide how long to back
/// off (the worker retries with exponential backoff until the database is back). A task
/// cancelled while it waits for a connection gets `CancellationError`.
public final class PostgresPool: Sendable {
    private struct State {
        var idle: [PostgresConnection] = []
        var open = 0
        var waiters = Waiters<Bool>()
        var closed = false
    }

    public let target: PostgresConnectionString
    public let size: Int
    public let connectTimeout: Duration
    /// The deadline of each call on the pool's connections (nil: none).
    public let callTimeout: Duration?
    /// Whether its connections prepare statements (see `PostgresConnection.connect`).
    public let preparesStatements: Bool
    /// Called (on the returning borrower's task) each time a connection comes back having
    /// found that the server does not keep its prepared statements: the pool's target is a
    /// transaction pooler, and `preparesStatements` must be off there. The connection is
    /// replaced either way.
    public let onPreparedStatementsNotKept: (@Sendable (PostgresError) -> Void)?
    private let state = BlockingLock(State())

    public init(target: PostgresConnectionString, size: Int, connectTimeout: Duration = .seconds(5),
                callTimeout: Duration? = .seconds(15), preparesStatements: Bool = true,
                onPreparedStatementsNotKept: (@Sendable (PostgresError) -> Void)? = nil) {
        precondition(size > 0, "a pool needs at least one connection")
        self.target = target
        self.size = size
        self.connectTimeout = connectTimeout
        self.callTimeout = callTimeout
        self.preparesStatements = preparesStatements
        self.onPreparedStatementsNotKept = onPreparedStatementsNotKept
    }

    /// Runs `body` with a connection of its own.
    /// - Throws: `PostgresError` when no connection can be opened, `CancellationError`
    ///   when cancelled while waiting for one, or what `body` throws.
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

    /// Connections open now (lent or idle).
    public var openCount: Int { state.withLock { $0.open } }

    /// Closes every idle connection and refuses new work; waiting tasks get an error.
    public func close() async {
        let (idle, waiters) = state.withLock { state -> ([PostgresConnection], [CheckedContinuation<Bool, Never>]) in
            state.closed = true
            defer { state.idle.removeAll() }
            state.open -= state.idle.count
            return (state.idle, state.waiters.removeAll())
        }
        for connection in idle { await connection.close() }
        for waiter in waiters { waiter.resume(returning: true) }
    }

    private enum Slot { case reuse(PostgresConnection), openNew, wait }

    private func checkOut() async throws -> PostgresConnection {
        while true {
            try Task.checkCancellation()
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
                    return try await PostgresConnection.connect(target, timeout: connectTimeout, callTimeout: callTimeout,
                                                                preparesStatements: preparesStatements)
                } catch {
                    release()
                    throw error
                }
            case .wait:
                _ = await state.suspend(in: \.waiters, cancelled: false) { state in
                    state.closed || !state.idle.isEmpty || state.open < size ? true : nil
                }
            }
        }
    }

    private func checkIn(_ connection: PostgresConnection) async {
        // Such a connection is no longer healthy: the lock is taken only then.
        if !connection.isHealthy, let error = connection.preparedStatementsNotKept { onPreparedStatementsNotKept?(error) }
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
        let (waiter, closeIt) = state.withLock { state -> (CheckedContinuation<Bool, Never>?, Bool) in
            if state.closed {
                state.open -= 1
                return (nil, true)
            }
            state.idle.append(connection)
            return (state.waiters.removeFirst(), false)
        }
        if closeIt { await connection.close() }
        waiter?.resume(returning: true)
    }

    private func discard(_ connection: PostgresConnection) async {
        await connection.close()
        release()
    }

    /// Gives back a slot of `open` and wakes one waiter to use it.
    private func release() {
        let waiter = state.withLock { state -> CheckedContinuation<Bool, Never>? in
            state.open -= 1
            return state.waiters.removeFirst()
        }
        waiter?.resume(returning: true)
    }
}
