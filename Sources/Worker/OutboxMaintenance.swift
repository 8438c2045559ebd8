import Foundation
import Postgres

/// The outbox's and the upstream records' upkeep: requeueing finished rows and pruning old
/// ones in small batches (each its own transaction, so that no lock is held for long and
/// replication keeps up).
enum OutboxMaintenance {
    /// Rows deleted per statement.
    static let pruneBatch = 5_000

    /// Sets finished rows of `statuses` back to pending, their attempts and error cleared,
    /// and wakes the workers (NOTIFY). Returns how many rows.
    static func requeue(statuses: [String], since: Duration?, on connection: PostgresConnection) async throws -> Int {
        let cutoff: PostgresValue = since.map { .timestamptz(Date().addingTimeInterval(-$0.seconds)) } ?? .null
        let count = try await connection.execute("""
            UPDATE downstream_messages
            SET status = 'pending', available_at = now(), attempts = 0, claimed_by = NULL, error_code = NULL,
                error_description = NULL, token_results = NULL
            WHERE status = ANY($1::text[]) AND available_at IS NULL AND ($2::timestamptz IS NULL OR created_at >= $2)
            """, [.array(statuses.map { .text($0) }), cutoff])
        if count > 0 { _ = try await connection.execute("SELECT pg_notify('fcm_downstream', current_schema())") }
        return count
    }

    /// Deletes `processed_upstream` records, finished outbox rows and dead letters older
    /// than `age`, a batch at a time; returns the rows deleted per table.
    static func prune(olderThan age: Duration, on connection: PostgresConnection) async throws -> [String: Int] {
        let cutoff = PostgresValue.timestamptz(Date().addingTimeInterval(-age.seconds))
        let tables: [(String, String)] = [
            ("processed_upstream", "SELECT ctid FROM processed_upstream WHERE processed_at < $1 LIMIT \(pruneBatch)"),
            ("downstream_messages", "SELECT ctid FROM downstream_messages WHERE available_at IS NULL AND created_at < $1 LIMIT \(pruneBatch)"),
            ("dead_letters", "SELECT ctid FROM dead_letters WHERE created_at < $1 LIMIT \(pruneBatch)"),
        ]
        var deleted: [String: Int] = [:]
        for (table, select) in tables {
            var total = 0
            while true {
                let count = try await connection.execute("DELETE FROM \(table) WHERE ctid = ANY(ARRAY(\(select)))", [cutoff])
                total += count
                if count < pruneBatch { break }
            }
            deleted[table] = total
        }
        return deleted
    }
}
