import Postgres

/// Which PostgreSQL server a connection reached, and whether it takes writes: what `status`
/// and `/readyz` show, so that an operator sees where the worker is after a failover.
struct DatabaseServer: Sendable, Equatable, CustomStringConvertible {
    /// The server's address as it sees it (`inet_server_addr`; "local socket" over a Unix socket).
    var host: String
    var port: Int
    /// False on a hot standby (in recovery): nothing can be committed there.
    var readWrite: Bool

    /// Asks the server on `connection` (one round trip).
    static func identify(on connection: PostgresConnection) async throws -> DatabaseServer {
        let row = try await connection.query("""
            SELECT coalesce(host(inet_server_addr()), 'local socket'), coalesce(inet_server_port(), 0), NOT pg_is_in_recovery()
            """).first
        return DatabaseServer(host: row?.string(0) ?? "unknown", port: Int(row?.int(1) ?? 0), readWrite: row?.bool(2) ?? false)
    }

    var address: String { port == 0 ? host : "\(host):\(port)" }

    var description: String { "\(address), " + (readWrite ? "read-write" : "read-only (a standby in recovery)") }
}
