import Foundation
import Postgres
import Runtime

/// The database's part of sending outbox rows, without the sending: the worker's own claim
/// and write-back statements run on rows that no connection sends, beside the two least
/// things any outbox that keeps each row's status in its row must ask of PostgreSQL per
/// message (locking the row while it is sent, and writing its final status once, a HOT
/// update since migration 0009), and reading the rows as a claim does. For `bench
/// downstream`, which measures PostgreSQL's CPU around each `run`: what the issue-16 goals
/// can reach depends on these, whatever the worker does around them.
package enum OutboxDatabaseCost: CaseIterable, Sendable, CustomStringConvertible {
    /// `OutboxStore.claim` then `OutboxStore.write` of an acked update, per batch: a
    /// message's claim (a claim row per batch) and its one row update, as the worker
    /// writes them.
    case claimAndWriteBack
    /// `SELECT … FOR UPDATE` of a batch in a transaction: the least a claim can cost that
    /// other workers must respect.
    case rowLock
    /// Reading a batch's rows by id as a claim returns them (every column the sender needs,
    /// and what `device_tokens` knows of each target), writing nothing: the least any claim
    /// costs, since the rows must be read to be sent.
    case rowRead
    /// One `UPDATE` per row of a batch that writes its final status (a HOT update: no
    /// index covers what it changes, and its page has room): the least writing a row's
    /// outcome into the row can cost.
    case statusUpdate

    package var description: String {
        switch self {
        case .claimAndWriteBack: "the worker's claim and write-back (a claim per batch, one row update)"
        case .rowLock: "a row lock alone (SELECT … FOR UPDATE)"
        case .rowRead: "reading the rows as a claim returns them, nothing written"
        case .statusUpdate: "one in-place final-status update alone"
        }
    }

    /// Rows per transaction: the claim's batch when the windows are busy.
    package static let batch = 100

    /// Empties the outbox and inserts `rows` rows due now, as `bench downstream` does
    /// before a run. `checkpoint`: a checkpoint first, so that the measured writes find pages
    /// made after it (the benchmark; not on a cluster that other work shares, whose every
    /// dirty page it would flush).
    package static func prepare(rows: Int, databaseURL: String, checkpoint: Bool = true) async throws {
        try await PostgresConnection.withConnection(databaseURL) { connection in
            try await connection.execute("TRUNCATE downstream_messages, device_tokens, outbox_claims")
            if checkpoint { try await connection.execute("CHECKPOINT") }
            _ = try await connection.pipeline([insertRows(rows)])
            try await connection.execute("ANALYZE downstream_messages")
        }
    }

    /// Inserts `rows` outbox rows due now, each to one of 10,000 bench tokens, with the
    /// benchmarks' payload: the rows `bench downstream` sends and these steps take through.
    package static func insertRows(_ rows: Int, transport: String = "xmpp") -> PostgresStatement {
        PostgresStatement("""
            INSERT INTO downstream_messages (target, payload, transport)
            SELECT 'bench-token-' || (g % 10000), '{"data":{"text":"benchmark payload"},"priority":"high"}'::jsonb, $2
            FROM generate_series(1, $1) AS g
            """, [.int(Int64(rows)), .text(transport)])
    }

    /// Takes every prepared row through this step, `batch` rows a transaction, on one
    /// connection. Returns the rows it went through.
    package func run(databaseURL: String) async throws -> Int {
        let pool = PostgresPool(target: try PostgresConnectionString(databaseURL), size: 1)
        do {
            let rows = try await run(on: pool)
            await pool.close()
            return rows
        } catch {
            await pool.close()
            throw error
        }
    }

    private func run(on pool: PostgresPool) async throws -> Int {
        switch self {
        case .claimAndWriteBack:
            let store = OutboxStore(pool: pool, workerID: "bench-floor", lease: .seconds(300), transport: "xmpp")
            var total = 0
            while true {
                let claimed = try await store.claim(limit: Self.batch)
                guard !claimed.isEmpty else { return total }
                let now = Date()
                try await store.write(claimed.map {
                    OutboxUpdate(rowID: $0.id, status: .acked, attempts: $0.attempts + 1, sentOn: "ccs#1", sentAt: now, ackedAt: now)
                }, tokens: [])
                total += claimed.count
            }
        case .rowLock, .rowRead, .statusUpdate:
            let ids = try await pool.withConnection { connection in
                try await connection.query("SELECT id FROM downstream_messages ORDER BY id").map { $0.int(0) ?? 0 }
            }
            let sql = switch self {
            case .rowLock: "SELECT id FROM downstream_messages WHERE id = ANY($1::bigint[]) FOR UPDATE"
            case .rowRead: """
                SELECT d.id, d.target, d.condition, d.payload::text, d.attempts, extract(epoch FROM d.created_at)::float8,
                       t.state, t.error_code, t.canonical_token, d.registration_ids, d.token_results::text
                FROM unnest($1::bigint[]) AS k(id) JOIN downstream_messages AS d ON d.id = k.id
                     LEFT JOIN device_tokens AS t ON t.token = d.target
                """
            default: """
                UPDATE downstream_messages SET status = 'acked', attempts = attempts + 1, sent_on = 'ccs#1',
                    sent_at = now(), acked_at = now(), available_at = NULL
                WHERE id = ANY($1::bigint[])
                """
            }
            var rows = 0
            for start in stride(from: 0, to: ids.count, by: Self.batch) {
                let batch = ids[start..<min(start + Self.batch, ids.count)]
                let results = try await pool.withConnection { connection in
                    try await connection.pipeline([PostgresStatement("BEGIN"),
                                                   PostgresStatement(sql, [.array(batch.map { .int($0) })]),
                                                   PostgresStatement("COMMIT")])
                }
                // What the read returned; what the others went through.
                rows += self == .rowRead ? results[1].rows.count : batch.count
            }
            return rows
        }
    }
}
