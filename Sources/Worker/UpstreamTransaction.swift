import Postgres

/// The open transaction of one batch: statements handlers `execute` are queued and sent
/// together in pipeline mode (one round trip) before the next query or at commit.
final class UpstreamTransaction {
    let connection: PostgresConnection
    private(set) var queued: [PostgresStatement] = []

    init(connection: PostgresConnection) {
        self.connection = connection
    }

    func enqueue(_ statement: PostgresStatement) {
        queued.append(statement)
    }

    /// Drops the queued statements (after a rollback).
    func discard() {
        queued.removeAll(keepingCapacity: true)
    }

    /// Sends the queued statements.
    func flush() async throws {
        guard !queued.isEmpty else { return }
        let statements = queued
        queued.removeAll(keepingCapacity: true)
        _ = try await connection.pipeline(statements)
    }

    /// Runs a query now, after the queued statements.
    func query(_ statement: PostgresStatement) async throws -> [PostgresRow] {
        try await flush()
        return try await connection.run(statement).rows
    }
}
