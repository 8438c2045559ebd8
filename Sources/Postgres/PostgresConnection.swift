import CLibPQ
import Foundation

/// One libpq connection, owned by a thread of its own.
///
/// Every libpq call for this connection runs on that thread; callers await the results.
/// The `PGconn` is closed when the connection is closed or deallocated.
public final class PostgresConnection: Sendable {
    private let thread: DedicatedThread
    private let handle: ConnectionHandle

    private init(thread: DedicatedThread, handle: ConnectionHandle) {
        self.thread = thread
        self.handle = handle
    }

    /// Connects with a URL (`postgresql://user@host:port/db`) or keyword conninfo string.
    ///
    /// - Throws: `PostgresError` of kind `.connection` when the server cannot be reached or
    ///   refuses the login within `timeout`.
    public static func connect(_ conninfo: String, timeout: Duration = .seconds(10)) async throws -> PostgresConnection {
        let thread = DedicatedThread(name: "postgres-connection")
        do {
            let handle = try await thread.run { try ConnectionHandle(conninfo: conninfo, timeout: timeout) }
            return PostgresConnection(thread: thread, handle: handle)
        } catch {
            thread.shutdown()
            throw error
        }
    }

    /// Runs one statement with text parameters `$1…` (never spliced into the SQL) and returns
    /// the rows as text values, `nil` for SQL NULL.
    public func query(_ sql: String, _ parameters: [String?] = []) async throws -> [[String?]] {
        let handle = self.handle
        return try await thread.run { try handle.execute(sql, parameters) }
    }

    /// Closes the connection; later queries fail.
    public func close() async {
        let handle = self.handle
        _ = try? await thread.run { handle.finish() }
        thread.shutdown()
    }

    deinit { thread.shutdown() }
}

/// Owns the `PGconn`; touched only on the connection's thread.
final class ConnectionHandle: @unchecked Sendable {
    private var connection: OpaquePointer?

    init(conninfo: String, timeout: Duration) throws {
        let seconds = max(1, Int(timeout.components.seconds))
        // libpq reads connect_timeout from the conninfo; keyword strings and URLs take it differently.
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
            let message = String(cString: PQerrorMessage(connection)).trimmingCharacters(in: .whitespacesAndNewlines)
            PQfinish(connection)
            self.connection = nil
            throw PostgresError(kind: .connection, message: message)
        }
    }

    func execute(_ sql: String, _ parameters: [String?]) throws -> [[String?]] {
        guard let connection else {
            throw PostgresError(kind: .connection, message: "the connection is closed")
        }
        let result = withCStringArray(parameters) { values in
            PQexecParams(connection, sql, Int32(parameters.count), nil, values, nil, nil, 0)
        }
        defer { PQclear(result) }
        switch PQresultStatus(result) {
        case PGRES_TUPLES_OK, PGRES_COMMAND_OK, PGRES_EMPTY_QUERY:
            var rows: [[String?]] = []
            let rowCount = PQntuples(result), columnCount = PQnfields(result)
            rows.reserveCapacity(Int(rowCount))
            for row in 0..<rowCount {
                var values: [String?] = []
                values.reserveCapacity(Int(columnCount))
                for column in 0..<columnCount {
                    values.append(PQgetisnull(result, row, column) == 1
                        ? nil : String(cString: PQgetvalue(result, row, column)))
                }
                rows.append(values)
            }
            return rows
        default:
            let sqlState = PQresultErrorField(result, Int32(UInt8(ascii: "C"))).map { String(cString: $0) }
            let message = String(cString: PQresultErrorMessage(result)).trimmingCharacters(in: .whitespacesAndNewlines)
            if PQstatus(connection) != CONNECTION_OK {
                throw PostgresError(kind: .connection, sqlState: sqlState, message: message)
            }
            throw PostgresError(kind: .statement, sqlState: sqlState, message: message)
        }
    }

    func finish() {
        if let connection { PQfinish(connection) }
        connection = nil
    }

    deinit { finish() }
}

/// Calls `body` with a C array of C strings (NULL for nil) valid for the call's duration.
private func withCStringArray<R>(_ strings: [String?], _ body: ([UnsafePointer<CChar>?]) -> R) -> R {
    let storage: [UnsafeMutablePointer<CChar>?] = strings.map { $0.map { strdup($0) } ?? nil }
    defer { for pointer in storage { free(pointer) } }
    return body(storage.map { $0.map { UnsafePointer($0) } })
}
