internal import CLibPQ
import Foundation
import Runtime

/// One libpq connection, owned by a thread of its own.
///
/// Every libpq call for this connection runs on that thread; callers await the results,
/// so the cooperative pool never blocks on the database. Every call has a deadline
/// (`callTimeout`): a server or network that goes silent makes the call fail after it with
/// a `.connection` error, and cancelling the calling task makes it fail at once; either
/// way the statement is cancelled on the server (`PQcancel`) and the connection is broken
/// (a pool replaces it). The `PGconn` is closed by `close()` or when the connection is
/// deallocated. One task uses a connection at a time (a pool hands it out exclusively);
/// sessions set `TimeZone` to UTC.
///
/// TCP keepalives and `tcp_user_timeout` are on unless the connection string sets them
/// (see `ConnectionHandle.networkDefaults`).
public final class PostgresConnection: Sendable {
    private let thread: DedicatedThread
    private let handle: ConnectionHandle
    /// How long one call may wait for the server; nil for no limit (migrations).
    public let callTimeout: Duration?

    private init(thread: DedicatedThread, handle: ConnectionHandle, callTimeout: Duration?) {
        self.thread = thread
        self.handle = handle
        self.callTimeout = callTimeout
    }

    /// Connects with a URL (`postgresql://user@host:port/db`) or keyword conninfo string.
    ///
    /// With `preparesStatements`, each SQL text with parameters is prepared on the server
    /// the first time this connection runs it (up to 64 texts), so the server parses it
    /// once. Turn it off behind a pooler that does not keep prepared statements across
    /// transactions (PgBouncer's transaction mode before 1.21).
    /// - Throws: `PostgresError` of kind `.configuration` when the string cannot be parsed,
    ///   `.connection` when the server cannot be reached or refuses the login within
    ///   `timeout`.
    public static func connect(_ conninfo: String, timeout: Duration = .seconds(10), callTimeout: Duration? = .seconds(15),
                               preparesStatements: Bool = true) async throws -> PostgresConnection {
        try await connect(try PostgresConnectionString(conninfo), timeout: timeout, callTimeout: callTimeout,
                          preparesStatements: preparesStatements)
    }

    /// Connects (as `connect(_:timeout:callTimeout:preparesStatements:)`), runs `body` on the
    /// connection, and closes it before returning or throwing: unlike a close left to a
    /// `Task` in a `defer`, none is still running when the process exits.
    @discardableResult
    public static func withConnection<T>(_ conninfo: String, callTimeout: Duration? = .seconds(15), preparesStatements: Bool = true,
                                         _ body: (PostgresConnection) async throws -> T) async throws -> T {
        let connection = try await connect(conninfo, callTimeout: callTimeout, preparesStatements: preparesStatements)
        do {
            let result = try await body(connection)
            await connection.close()
            return result
        } catch {
            await connection.close()
            throw error
        }
    }

    /// Connects to a parsed connection string (see `connect(_:timeout:callTimeout:preparesStatements:)`).
    public static func connect(_ target: PostgresConnectionString, timeout: Duration = .seconds(10), callTimeout: Duration? = .seconds(15),
                               preparesStatements: Bool = true) async throws -> PostgresConnection {
        let thread = DedicatedThread(name: "postgres-connection")
        do {
            let handle = try ConnectionHandle(target: target, preparedLimit: preparesStatements ? 64 : 0)
            let deadline = ContinuousClock.now + timeout
            try await withTaskCancellationHandler {
                try await thread.run { try handle.connect(deadline: deadline) }
            } onCancel: {
                handle.interrupt()
            }
            return PostgresConnection(thread: thread, handle: handle, callTimeout: callTimeout)
        } catch {
            thread.shutdown()
            throw error
        }
    }

    /// The error that showed the server does not keep this connection's prepared statements
    /// (see `PostgresError.meansPreparedStatementsAreNotKept`), once a call got one; the
    /// connection is then no longer healthy.
    public var preparedStatementsNotKept: PostgresError? { handle.preparedStatementsNotKept.withLock { $0 } }

    /// Runs one statement and returns its rows (text values, nil for NULL).
    public func query(_ sql: String, _ parameters: [PostgresValue] = []) async throws -> [PostgresRow] {
        try await run(PostgresStatement(sql, parameters)).rows
    }

    /// Runs one statement and returns how many rows it affected.
    @discardableResult
    public func execute(_ sql: String, _ parameters: [PostgresValue] = []) async throws -> Int {
        try await run(PostgresStatement(sql, parameters)).affectedRows
    }

    /// Runs one statement.
    public func run(_ statement: PostgresStatement) async throws -> PostgresResult {
        try await call { handle, deadline in try handle.execute(statement, deadline: deadline) }
    }

    /// Runs SQL text that may hold several statements and no parameters (migrations).
    public func simpleQuery(_ sql: String) async throws {
        try await call { handle, deadline in try handle.simpleQuery(sql, deadline: deadline) }
    }

    /// Runs `body` on the connection's thread with the call's deadline; cancelling the
    /// calling task interrupts it.
    private func call<T: Sendable>(_ body: @escaping @Sendable (ConnectionHandle, ContinuousClock.Instant?) throws -> T) async throws -> T {
        let handle = self.handle
        let deadline = callTimeout.map { ContinuousClock.now + $0 }
        return try await withTaskCancellationHandler {
            try await thread.run { try body(handle, deadline) }
        } onCancel: {
            handle.interrupt()
        }
    }

    /// Sends every statement at once in libpq's pipeline mode (one round trip) and returns
    /// their results in order.
    /// - Throws: the first statement's error (its index is in the message); statements
    ///   after it did not run. Inside a transaction the transaction is then aborted.
    public func pipeline(_ statements: [PostgresStatement]) async throws -> [PostgresResult] {
        try await call { handle, deadline in try handle.pipeline(statements, deadline: deadline) }
    }

    /// Runs `body` inside BEGIN … COMMIT; rolls back and rethrows if it throws.
    public func transaction<T: Sendable>(_ body: (PostgresConnection) async throws -> T) async throws -> T {
        try await execute("BEGIN")
        do {
            let value = try await body(self)
            try await execute("COMMIT")
            return value
        } catch {
            _ = try? await execute("ROLLBACK")
            throw error
        }
    }

    /// Runs `body` inside a savepoint of the current transaction; on error rolls back to it
    /// (the transaction goes on) and rethrows.
    public func savepoint<T: Sendable>(_ name: String = "fcm_sp", _ body: (PostgresConnection) async throws -> T) async throws -> T {
        let identifier = Self.quoteIdentifier(name)
        try await execute("SAVEPOINT \(identifier)")
        do {
            let value = try await body(self)
            try await execute("RELEASE SAVEPOINT \(identifier)")
            return value
        } catch {
            _ = try? await execute("ROLLBACK TO SAVEPOINT \(identifier)")
            throw error
        }
    }

    /// Starts listening for NOTIFY on `channel`.
    public func listen(_ channel: String) async throws {
        try await execute("LISTEN \(Self.quoteIdentifier(channel))")
    }

    /// Waits up to `timeout` for a notification on a channel this connection listens to
    /// (cancelling the task ends the wait and breaks the connection). Blocks only this
    /// connection's own thread.
    public func nextNotification(timeout: Duration) async throws -> PostgresNotification? {
        try await call { handle, _ in try handle.nextNotification(timeout: timeout) }
    }

    /// False once the connection is known to be broken (a pool then replaces it).
    public var isHealthy: Bool { handle.isHealthy }

    /// False while a transaction is open or aborted on this connection, as of the last
    /// statement sent. A pool rolls such a connection back before lending it again.
    public var isOutsideTransaction: Bool { handle.isOutsideTransaction }

    /// Closes the connection; later calls fail. Never waits for the server.
    public func close() async {
        let handle = self.handle
        handle.interrupt()
        thread.submit { handle.finish() }
        thread.shutdown()
    }

    deinit { thread.shutdown() }

    /// `text` (a URL, conninfo or libpq message) with any password replaced by `***`, on
    /// one line.
    public static func redactingPasswords(_ text: String) -> String {
        PostgresConnectionString.redactPatterns(text)
    }

    /// `name` as a double-quoted SQL identifier.
    public static func quoteIdentifier(_ name: String) -> String {
        "\"" + name.replacingOccurrences(of: "\"", with: "\"\"") + "\""
    }
}
