import Foundation
import Postgres

/// The outbox's and the upstream records' upkeep: requeueing finished rows and pruning old
/// ones in small batches (each its own transaction, so that no lock is held for long and
/// replication keeps up).
package enum OutboxMaintenance {
    /// Rows deleted, or read by a walk of the outbox, per statement.
    package static let batchSize = 5_000

    /// Sets finished rows of `statuses` back to pending, their attempts and error cleared,
    /// and wakes the workers (NOTIFY). Returns how many rows.
    ///
    /// With `since`, only rows created since then: the outbox is walked back from its newest
    /// row by id, a batch at a time, until a whole batch is older (no index on creation time:
    /// see migration 0008; rows are created in id order, save a transaction's few seconds).
    package static func requeue(statuses: [String], since: Duration?, on connection: PostgresConnection) async throws -> Int {
        let set = """
            UPDATE downstream_messages
            SET status = 'pending', available_at = now(), attempts = 0, claimed_by = NULL, error_code = NULL,
                error_description = NULL, token_results = NULL, message_name = NULL
            """
        let count: Int
        if let since {
            let cutoff = PostgresValue.timestamptz(Date().addingTimeInterval(-since.seconds))
            count = try await walkOutbox(newestFirst: true, on: connection, parameters: [.array(statuses.map { .text($0) }), cutoff],
                                         change: "\(set) WHERE id IN (SELECT id FROM batch) AND status = ANY($1::text[]) AND available_at IS NULL AND created_at >= $2",
                                         goesOnWhile: "created_at >= $2")
        } else {
            count = try await connection.execute("\(set) WHERE status = ANY($1::text[]) AND available_at IS NULL",
                                                 [.array(statuses.map { .text($0) })])
        }
        if count > 0 { _ = try await connection.execute("SELECT pg_notify('fcm_downstream', current_schema())") }
        return count
    }

    /// The transport of rows inserted without one (the `transport` column's default).
    package static func defaultTransport(on connection: PostgresConnection) async throws -> String {
        let expression = try await connection.query("""
            SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef AS d
            JOIN pg_attribute AS a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
            WHERE d.adrelid = 'downstream_messages'::regclass AND a.attname = 'transport'
            """).first?.string(0) ?? ""
        // 'xmpp'::text
        let quoted = expression.dropFirst()
        guard expression.hasPrefix("'"), let end = quoted.firstIndex(of: "'") else { return expression }
        return String(quoted[..<end])
    }

    /// Makes `transport` the default of rows inserted without one, from the next insert on
    /// (handlers that name none, and SQL that leaves the column out).
    package static func setDefaultTransport(_ transport: String, on connection: PostgresConnection) async throws {
        precondition(["xmpp", "http", "v1"].contains(transport))
        _ = try await connection.execute("ALTER TABLE downstream_messages ALTER COLUMN transport SET DEFAULT '\(transport)'")
    }

    /// Walks the outbox by id, `batchSize` rows a statement, from its newest row or its
    /// oldest, running `change` (an UPDATE or DELETE that may name `batch`, the walked rows'
    /// `id` and `created_at`) on each batch, while some row of the batch meets
    /// `goesOnWhile`. `parameters` are `$1`…; the walk's own position comes after them.
    /// Returns the rows `change` touched.
    private static func walkOutbox(newestFirst: Bool, on connection: PostgresConnection, parameters: [PostgresValue],
                                   change: String, goesOnWhile condition: String) async throws -> Int {
        let position = "$\(parameters.count + 1)"
        var edge = newestFirst ? Int64.max : Int64.min
        var total = 0
        while true {
            let row = try await connection.query("""
                WITH batch AS (SELECT id, created_at FROM downstream_messages WHERE id \(newestFirst ? "<" : ">") \(position)::bigint
                               ORDER BY id \(newestFirst ? "DESC" : "ASC") LIMIT \(batchSize)),
                     changed AS (\(change) RETURNING 1)
                SELECT (SELECT \(newestFirst ? "min" : "max")(id) FROM batch), (SELECT count(*) FROM changed),
                       (SELECT bool_or(\(condition)) FROM batch)
                """, parameters + [.int(edge)]).first
            total += Int(row?.int(1) ?? 0)
            guard let next = row?.int(0), row?.bool(2) == true else { return total }
            edge = next
        }
    }

    /// Deletes `processed_upstream` records, finished outbox rows and dead letters older
    /// than `age`, a batch at a time; returns the rows deleted per table. The outbox is
    /// walked from its oldest row by id until a whole batch is newer than the cutoff (see
    /// `requeue`).
    package static func prune(olderThan age: Duration, on connection: PostgresConnection) async throws -> [String: Int] {
        let cutoff = PostgresValue.timestamptz(Date().addingTimeInterval(-age.seconds))
        let tables: [(String, String)] = [
            ("processed_upstream", "SELECT ctid FROM processed_upstream WHERE processed_at < $1 LIMIT \(batchSize)"),
            ("dead_letters", "SELECT ctid FROM dead_letters WHERE created_at < $1 LIMIT \(batchSize)"),
        ]
        var deleted: [String: Int] = [:]
        for (table, select) in tables {
            var total = 0
            while true {
                let count = try await connection.execute("DELETE FROM \(table) WHERE ctid = ANY(ARRAY(\(select)))", [cutoff])
                total += count
                if count < batchSize { break }
            }
            deleted[table] = total
        }
        // The conditions on the row itself: one changed since its batch was read is judged as it is now.
        let total = try await walkOutbox(newestFirst: false, on: connection, parameters: [cutoff],
                                         change: "DELETE FROM downstream_messages WHERE id IN (SELECT id FROM batch) AND available_at IS NULL AND created_at < $1",
                                         goesOnWhile: "created_at < $1")
        deleted["downstream_messages"] = total
        return deleted
    }
}
