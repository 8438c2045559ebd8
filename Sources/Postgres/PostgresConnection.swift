internal import CLibPQ
import Foundation
import Runtime

/// One libpq connection, owned by a thread of its own.
///
/// Every libpq call for this connection runs on that thread; callers await the results,
/// so the cooperative pool never blocks on the database. The `PGconn` is closed by
/// `close()` or when the connection is deallocated. One task uses a connection at a time
/// (a pool hands it out exclusively); sessions set `TimeZone` to UTC.
public final class PostgresConnection: Sendable {
    private let thread: DedicatedThread
    private let handle: ConnectionHandle

    private init(thread: DedicatedThread, handle: ConnectionHandle) {
        self.thread = thread
        self.handle = handle
    }

    /// Connects with a URL (`postgresql://user@host:port/db`) or keyword conninfo string.
    ///
    /// With `preparesStatements`, each SQL text with parameters is prepared on the server
    /// the first time this connection runs it (up to 64 texts), so the server parses it
    /// once. Turn it off behind a pooler that does not keep prepared statements across
    /// transactions (PgBouncer's transaction mode before 1.21).
    /// - Throws: `PostgresError` of kind `.connection` when the server cannot be reached or
    ///   refuses the login within `timeout`.
    public static func connect(_ conninfo: String, timeout: Duration = .seconds(10),
                               preparesStatements: Bool = true) async throws -> PostgresConnection {
        let thread = DedicatedThread(name: "postgres-connection")
        do {
            let handle = try await thread.run {
                try ConnectionHandle(conninfo: conninfo, timeout: timeout, preparedLimit: preparesStatements ? 64 : 0)
            }
            return PostgresConnection(thread: thread, handle: handle)
        } catch {
            thread.shutdown()
            throw error
        }
    }

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
        let handle = self.handle
        return try await thread.run { try handle.execute(statement) }
    }

    /// Runs SQL text that may hold several statements and no parameters (migrations).
    public func simpleQuery(_ sql: String) async throws {
        let handle = self.handle
        try await thread.run { try handle.simpleQuery(sql) }
    }

    /// Sends every statement at once in libpq's pipeline mode (one round trip) and returns
    /// their results in order.
    /// - Throws: the first statement's error (its index is in the message); statements
    ///   after it did not run. Inside a transaction the transaction is then aborted.
    public func pipeline(_ statements: [PostgresStatement]) async throws -> [PostgresResult] {
        let handle = self.handle
        return try await thread.run { try handle.pipeline(statements) }
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

    /// Waits up to `timeout` for a notification on a channel this connection listens to.
    /// Blocks only this connection's own thread.
    public func nextNotification(timeout: Duration) async throws -> PostgresNotification? {
        let handle = self.handle
        return try await thread.run { try handle.nextNotification(timeout: timeout) }
    }

    /// False once the connection is known to be broken (a pool then replaces it).
    public var isHealthy: Bool { handle.isHealthy }

    /// False while a transaction is open or aborted on this connection, as of the last
    /// statement sent. A pool rolls such a connection back before lending it again.
    public var isOutsideTransaction: Bool { handle.isOutsideTransaction }

    /// Closes the connection; later calls fail.
    public func close() async {
        let handle = self.handle
        _ = try? await thread.run { handle.finish() }
        thread.shutdown()
    }

    deinit { thread.shutdown() }

    /// `text` (a URL, conninfo or libpq message) with any password replaced by `***`.
    public static func redactingPasswords(_ text: String) -> String {
        ConnectionHandle.redact(text)
    }

    /// `name` as a double-quoted SQL identifier.
    public static func quoteIdentifier(_ name: String) -> String {
        "\"" + name.replacingOccurrences(of: "\"", with: "\"\"") + "\""
    }
}

/// Owns the `PGconn`; touched only on the connection's thread (`isHealthy` reads a flag).
final class ConnectionHandle: @unchecked Sendable {
    private var connection: OpaquePointer?
    private let healthy = AtomicFlag(true)
    /// False while a transaction is open (or aborted) on the server, as of the last call.
    private let outsideTransaction = AtomicFlag(true)
    /// SQL text → the server-side prepared statement made for it on this connection.
    private var preparedNames: [String: String] = [:]
    /// Names handed out so far (a failed preparation's name is not reused).
    private var preparedCount = 0
    /// Statements prepared at most: past it, new SQL texts run unprepared (so handlers that
    /// build SQL text on the fly cannot grow the server's memory). Zero prepares none.
    private let preparedLimit: Int

    init(conninfo: String, timeout: Duration, preparedLimit: Int) throws {
        self.preparedLimit = preparedLimit
        let seconds = max(1, Int(timeout.components.seconds))
        // libpq reads connect_timeout from the conninfo; URLs and keyword strings take it differently.
        let withTimeout: String
        if conninfo.hasPrefix("postgres://") || conninfo.hasPrefix("postgresql://") {
            withTimeout = conninfo + (conninfo.contains("?") ? "&" : "?") + "connect_timeout=\(seconds)"
        } else {
            withTimeout = conninfo + " connect_timeout=\(seconds)"
        }
        connection = PQconnectdb(withTimeout)
        guard let connection else {
            throw PostgresError(kind: .connection, message: "libpq could not allocate a connection")
        }
        guard PQstatus(connection) == CONNECTION_OK else {
            let message = Self.redact(String(cString: PQerrorMessage(connection)))
            PQfinish(connection)
            self.connection = nil
            throw PostgresError(kind: .connection, message: message)
        }
        PQsetNoticeReceiver(connection, Self.receiveNotice, nil)
        let setup = PQexec(connection, "SET TimeZone = 'UTC'; SET DateStyle = 'ISO'")
        PQclear(setup)
    }

    /// Server notices: warnings go to standard error as `postgres WARNING: …`; NOTICE,
    /// INFO and DEBUG messages ("relation … already exists, skipping") are dropped rather
    /// than printed raw into the worker's log as libpq would by default.
    private static let receiveNotice: PQnoticeReceiver = { _, result in
        guard let result, let severity = PQresultErrorField(result, Int32(UInt8(ascii: "V"))),
              String(cString: severity) == "WARNING", let message = PQresultErrorMessage(result) else { return }
        FileHandle.standardError.write(Data("postgres \(redact(String(cString: message)))".utf8))
    }

    var isHealthy: Bool { healthy.value }
    var isOutsideTransaction: Bool { outsideTransaction.value }

    /// Records whether a transaction is open; called on this connection's thread after
    /// every call that sends SQL.
    private func noteTransactionStatus() {
        guard let connection else { return }
        outsideTransaction.value = PQtransactionStatus(connection) == PQTRANS_IDLE
    }

    func execute(_ statement: PostgresStatement) throws -> PostgresResult {
        let connection = try live()
        defer { noteTransactionStatus() }
        // Statements with parameters are prepared on first use, as in `pipeline`.
        var name = preparedNames[statement.sql]
        if name == nil, let candidate = newPreparedName(for: statement) {
            let preparation = PQprepare(connection, candidate, statement.sql, Int32(statement.parameters.count), nil)
            defer { PQclear(preparation) }
            _ = try decode(preparation, statement: 0)
            preparedNames[statement.sql] = candidate
            name = candidate
        }
        let result = withParameters(statement.parameters) { values in
            if let name { return PQexecPrepared(connection, name, Int32(values.count), values, nil, nil, 0) }
            return PQexecParams(connection, statement.sql, Int32(values.count), nil, values, nil, nil, 0)
        }
        defer { PQclear(result) }
        do {
            return try decode(result, statement: 0)
        } catch let error as PostgresError {
            forgetIfStale(statement.sql, after: error)
            throw error
        }
    }

    /// A fresh name to prepare `statement` under, or nil when it has no parameters or the
    /// limit is reached (`pending`: preparations sent but not yet confirmed).
    private func newPreparedName(for statement: PostgresStatement, pending: Int = 0) -> String? {
        guard !statement.parameters.isEmpty, preparedNames.count + pending < preparedLimit else { return nil }
        preparedCount += 1
        return "fcm_\(preparedCount)"
    }

    /// A prepared statement whose tables changed shape (`SELECT *` after `ALTER TABLE`)
    /// fails with "cached plan must not change result type" until it is prepared again:
    /// forget it, so the next run of that SQL prepares a fresh one. (The old one stays on
    /// the server until the connection closes: one per such change.)
    private func forgetIfStale(_ sql: String, after error: PostgresError) {
        if error.sqlState == "0A000" { preparedNames[sql] = nil }
    }

    func simpleQuery(_ sql: String) throws {
        let connection = try live()
        defer { noteTransactionStatus() }
        let result = PQexec(connection, sql)
        defer { PQclear(result) }
        _ = try decode(result, statement: 0)
    }

    func pipeline(_ statements: [PostgresStatement]) throws -> [PostgresResult] {
        let connection = try live()
        guard !statements.isEmpty else { return [] }
        guard PQenterPipelineMode(connection) == 1 else { throw connectionError("cannot enter pipeline mode") }
        defer {
            PQexitPipelineMode(connection)
            noteTransactionStatus()
        }
        // Statements with parameters run as prepared statements, prepared on first use in
        // the same pipeline: the server then parses each once per connection (and, once
        // its generic plan proves as good, plans it once too).
        var preparing: [Int: String] = [:]
        var preparingNames: [String: String] = [:]
        for (index, statement) in statements.enumerated() {
            let sent: Int32
            if let name = preparedNames[statement.sql] ?? preparingNames[statement.sql] {
                sent = withParameters(statement.parameters) { values in
                    PQsendQueryPrepared(connection, name, Int32(values.count), values, nil, nil, 0)
                }
            } else if let name = newPreparedName(for: statement, pending: preparing.count) {
                preparingNames[statement.sql] = name
                guard PQsendPrepare(connection, name, statement.sql, Int32(statement.parameters.count), nil) == 1 else {
                    throw connectionError("sending a pipelined statement failed")
                }
                preparing[index] = name
                sent = withParameters(statement.parameters) { values in
                    PQsendQueryPrepared(connection, name, Int32(values.count), values, nil, nil, 0)
                }
            } else {
                sent = withParameters(statement.parameters) { values in
                    PQsendQueryParams(connection, statement.sql, Int32(values.count), nil, values, nil, nil, 0)
                }
            }
            guard sent == 1 else { throw connectionError("sending a pipelined statement failed") }
        }
        guard PQpipelineSync(connection) == 1 else { throw connectionError("pipeline sync failed") }
        var results: [PostgresResult] = []
        results.reserveCapacity(statements.count)
        var firstError: PostgresError?
        // Each statement's results end with a NULL (a preparation's come first, ending the
        // same way); then comes the sync marker.
        for index in statements.indices {
            if let name = preparing[index] {
                var prepared = false
                while let result = PQgetResult(connection) {
                    defer { PQclear(result) }
                    if PQresultStatus(result) == PGRES_COMMAND_OK {
                        prepared = true
                    } else if PQresultStatus(result) != PGRES_PIPELINE_ABORTED {
                        do { _ = try decode(result, statement: index) } catch let error as PostgresError {
                            if firstError == nil { firstError = error }
                        }
                    }
                }
                if prepared { preparedNames[statements[index].sql] = name }
            }
            var outcome: PostgresResult?
            while let result = PQgetResult(connection) {
                defer { PQclear(result) }
                if PQresultStatus(result) == PGRES_PIPELINE_ABORTED { continue }
                do {
                    outcome = try decode(result, statement: index)
                } catch let error as PostgresError {
                    forgetIfStale(statements[index].sql, after: error)
                    if firstError == nil { firstError = error }
                }
            }
            if let outcome { results.append(outcome) }
            if PQstatus(connection) != CONNECTION_OK { break }
        }
        while let result = PQgetResult(connection) {
            let status = PQresultStatus(result)
            PQclear(result)
            if status == PGRES_PIPELINE_SYNC { break }
        }
        if PQstatus(connection) != CONNECTION_OK {
            healthy.value = false
            throw firstError ?? connectionError("the connection broke during a pipeline")
        }
        if let firstError { throw firstError }
        return results
    }

    func nextNotification(timeout: Duration) throws -> PostgresNotification? {
        let connection = try live()
        let deadline = ContinuousClock.now + timeout
        while true {
            guard PQconsumeInput(connection) == 1 else { throw connectionError("reading notifications failed") }
            if let notification = PQnotifies(connection) {
                defer { PQfreemem(notification) }
                return PostgresNotification(channel: String(cString: notification.pointee.relname),
                                            payload: String(cString: notification.pointee.extra))
            }
            let remaining = deadline - .now
            if remaining <= .zero { return nil }
            var descriptor = pollfd(fd: PQsocket(connection), events: Int16(POLLIN), revents: 0)
            let milliseconds = remaining.components.seconds * 1000 + remaining.components.attoseconds / 1_000_000_000_000_000 + 1
            _ = poll(&descriptor, 1, Int32(min(milliseconds, 60_000)))
        }
    }

    func finish() {
        if let connection { PQfinish(connection) }
        connection = nil
        healthy.value = false
    }

    deinit { finish() }

    private func live() throws -> OpaquePointer {
        guard let connection, healthy.value else {
            throw PostgresError(kind: .connection, message: "the connection is closed")
        }
        return connection
    }

    private func connectionError(_ what: String) -> PostgresError {
        let detail = connection.map { String(cString: PQerrorMessage($0)) } ?? ""
        if let connection, PQstatus(connection) != CONNECTION_OK { healthy.value = false }
        return PostgresError(kind: .connection, message: Self.redact("\(what): \(detail)"))
    }

    private func decode(_ result: OpaquePointer?, statement index: Int) throws -> PostgresResult {
        guard let result else { throw connectionError("no result") }
        switch PQresultStatus(result) {
        case PGRES_TUPLES_OK, PGRES_COMMAND_OK, PGRES_EMPTY_QUERY:
            let rowCount = PQntuples(result), columnCount = PQnfields(result)
            var columns: [String] = []
            columns.reserveCapacity(Int(columnCount))
            for column in 0..<columnCount { columns.append(String(cString: PQfname(result, column))) }
            var rows: [PostgresRow] = []
            rows.reserveCapacity(Int(rowCount))
            for row in 0..<rowCount {
                var values: [String?] = []
                values.reserveCapacity(Int(columnCount))
                for column in 0..<columnCount {
                    values.append(PQgetisnull(result, row, column) == 1 ? nil : String(cString: PQgetvalue(result, row, column)))
                }
                rows.append(PostgresRow(columns: columns, values: values))
            }
            let affected = Int(String(cString: PQcmdTuples(result))) ?? 0
            return PostgresResult(rows: rows, affectedRows: affected)
        default:
            let sqlState = PQresultErrorField(result, Int32(UInt8(ascii: "C"))).map { String(cString: $0) }
            let message = String(cString: PQresultErrorMessage(result)).trimmingCharacters(in: .whitespacesAndNewlines)
            if let connection, PQstatus(connection) != CONNECTION_OK {
                healthy.value = false
                throw PostgresError(kind: .connection, sqlState: sqlState, message: Self.redact(message))
            }
            // Class 08 is "connection exception"; 57P01-03 are shutdowns.
            if let sqlState, sqlState.hasPrefix("08") || sqlState.hasPrefix("57P") {
                healthy.value = false
                throw PostgresError(kind: .connection, sqlState: sqlState, message: message)
            }
            throw PostgresError(kind: .statement, sqlState: sqlState, message: message, statementIndex: index)
        }
    }

    /// Removes `password=…` and URL passwords from libpq messages.
    static func redact(_ message: String) -> String {
        var text = message.trimmingCharacters(in: .whitespacesAndNewlines)
        if let range = text.range(of: #"://[^:@/\s]+:[^@/\s]+@"#, options: .regularExpression) {
            text.replaceSubrange(range, with: "://***@")
        }
        if let range = text.range(of: #"password=\S+"#, options: .regularExpression) {
            text.replaceSubrange(range, with: "password=***")
        }
        return text
    }
}

/// Calls `body` with a C array of text-format parameters (NULL for SQL NULL).
private func withParameters<R>(_ parameters: [PostgresValue], _ body: ([UnsafePointer<CChar>?]) -> R) -> R {
    let storage: [UnsafeMutablePointer<CChar>?] = parameters.map { $0.textEncoding.map { strdup($0) } ?? nil }
    defer { for pointer in storage { free(pointer) } }
    return body(storage.map { $0.map { UnsafePointer($0) } })
}
