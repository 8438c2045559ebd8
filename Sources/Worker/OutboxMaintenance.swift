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
    ///
    /// With `since`, only rows created since then: the outbox is walked back from its newest
    /// row by id, a batch at a time, until a whole batch is older (no index on creation time:
    /// see migration 0008; rows are created in id order, save a transaction's few seconds).
    static func requeue(statuses: [String], since: Duration?, on connection: PostgresConnection) async throws -> Int {
        let set = """
            UPDATE downstream_messages
            SET status = 'pending', available_at = now(), attempts = 0, claimed_by = NULL, error_code = NULL,
                error_description = NULL, token_results = NULL
            """
        var count = 0
        if let since {
            let cutoff = PostgresValue.timestamptz(Date().addingTimeInterval(-since.seconds))
            var below = Int64.max
            while true {
                let row = try await connection.query("""
                    WITH batch AS (SELECT id, created_at FROM downstream_messages WHERE id < $3 ORDER BY id DESC LIMIT \(walkBatch)),
                         done AS (\(set) WHERE id IN (SELECT id FROM batch) AND status = ANY($1::text[]) AND available_at IS NULL
                                  AND created_at >= $2 RETURNING 1)
                    SELECT (SELECT min(id) FROM batch), (SELECT count(*) FROM done), (SELECT bool_or(created_at >= $2) FROM batch)
                    """, [.array(statuses.map { .text($0) }), cutoff, .int(below)]).first
                count += Int(row?.int(1) ?? 0)
                guard let lowest = row?.int(0), row?.bool(2) == true else { break }
                below = lowest
            }
        } else {
            count = try await connection.execute("\(set) WHERE status = ANY($1::text[]) AND available_at IS NULL",
                                                 [.array(statuses.map { .text($0) })])
        }
        if count > 0 { _ = try await connection.execute("SELECT pg_notify('fcm_downstream', current_schema())") }
        return count
    }

    /// Rows of the outbox read per statement when it is walked by id.
    static let walkBatch = 5_000

    /// Deletes `processed_upstream` records, finished outbox rows and dead letters older
    /// than `age`, a batch at a time; returns the rows deleted per table. The outbox is
    /// walked from its oldest row by id until a whole batch is newer than the cutoff (see
    /// `requeue`).
    static func prune(olderThan age: Duration, on connection: PostgresConnection) async throws -> [String: Int] {
        let cutoff = PostgresValue.timestamptz(Date().addingTimeInterval(-age.seconds))
        let tables: [(String, String)] = [
            ("processed_upstream", "SELECT ctid FROM processed_upstream WHERE processed_at < $1 LIMIT \(pruneBatch)"),
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
        var total = 0
        var above = Int64.min
        while true {
            let row = try await connection.query("""
                WITH batch AS (SELECT id, created_at, available_at FROM downstream_messages WHERE id > $2 ORDER BY id LIMIT \(walkBatch)),
                     -- The conditions again on the row itself: one changed since the batch was read is judged as it is now.
                     gone AS (DELETE FROM downstream_messages WHERE id IN (SELECT id FROM batch) AND available_at IS NULL AND created_at < $1
                              RETURNING 1)
                SELECT (SELECT max(id) FROM batch), (SELECT count(*) FROM gone), (SELECT bool_or(created_at < $1) FROM batch)
                """, [cutoff, .int(above)]).first
            total += Int(row?.int(1) ?? 0)
            guard let highest = row?.int(0), row?.bool(2) == true else { break }
            above = highest
        }
        deleted["downstream_messages"] = total
        return deleted
    }
}
