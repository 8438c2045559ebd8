import FCM
import Foundation
import Postgres
import Runtime
import XMPP

/// The outbox table as the sender uses it: claiming rows under a lease, writing their
/// delivery state back, renewing and handing back claims, and marking tokens.
///
/// Claims use `FOR UPDATE SKIP LOCKED`, so several workers on one database never claim
/// the same row at once; a claim lasts `lease` unless renewed, after which another
/// worker takes the row over (its worker crashed, or lost the database for that long).
/// State is written back only where this worker still holds the claim.
struct OutboxStore: Sendable {
    let pool: PostgresPool
    /// Who claims: written to `claimed_by`.
    let workerID: String
    let lease: Duration
    /// The rows this store claims: `xmpp` or `http`.
    var transport: String

    init(pool: PostgresPool, workerID: String, lease: Duration, transport: String) {
        self.pool = pool
        self.workerID = workerID
        self.lease = lease
        self.transport = transport
    }

    /// A claimed row, with what `device_tokens` knows about its target.
    struct ClaimedRow: Sendable {
        let id: Int64
        let target: String?
        let condition: String?
        let payload: String
        /// Times sent before this claim.
        let attempts: Int
        let createdAt: Date
        let tokenState: TokenMark.State?
        let tokenErrorCode: String?
        let canonicalToken: String?
        /// The tokens of a multicast row (HTTP only).
        let registrationIDs: [String]?
        /// Per-token outcomes of earlier attempts (HTTP multicast), as JSON text.
        let tokenResults: String?
    }

    /// The claim: $1 the worker, $2 the limit, $3 the lease in seconds, $4 the transport.
    ///
    /// The picked ids go to the UPDATE as an array (`id = ANY(ARRAY(…))`), not as a
    /// join: the prepared statement's generic plan cannot know the LIMIT, guesses
    /// 10,000 rows, and joined by hashing the whole table, read in full at every claim
    /// (measured: 44 of a claim's 58 ms at 100,000 rows, growing with the table).
    static let claimSQL = """
        WITH claimed AS (
            UPDATE downstream_messages AS d
            SET status = 'sending', claimed_by = $1, available_at = now() + make_interval(secs => $3)
            WHERE d.id = ANY(ARRAY(
                SELECT id FROM downstream_messages
                WHERE transport = $4 AND available_at <= now()
                ORDER BY available_at, id
                LIMIT $2
                FOR UPDATE SKIP LOCKED))
            RETURNING d.id, d.target, d.condition, d.payload, d.attempts, d.created_at, d.registration_ids,
                      d.token_results
        )
        SELECT c.id, c.target, c.condition, c.payload::text, c.attempts,
               extract(epoch FROM c.created_at)::float8, t.state, t.error_code, t.canonical_token,
               c.registration_ids, c.token_results::text
        FROM claimed AS c LEFT JOIN device_tokens AS t ON t.token = c.target
        ORDER BY c.id
        """

    /// Claims up to `limit` rows that are due, oldest first.
    func claim(limit: Int) async throws -> [ClaimedRow] {
        let rows = try await pool.withConnection { connection in
            try await connection.query(Self.claimSQL, [.text(workerID), .int(Int64(limit)), .double(lease.seconds), .text(transport)])
        }
        return rows.map { row in
            ClaimedRow(id: row.int(0) ?? 0, target: row.string(1), condition: row.string(2), payload: row.string(3) ?? "{}",
                       attempts: Int(row.int(4) ?? 0), createdAt: Date(timeIntervalSince1970: row.double(5) ?? 0),
                       tokenState: row.string(6).flatMap(TokenMark.State.init(rawValue:)), tokenErrorCode: row.string(7),
                       canonicalToken: row.string(8), registrationIDs: row.strings(9),
                       tokenResults: row.string(10))
        }
    }

    /// Writes `updates` (one per row) and `tokens` (one per token) in one transaction.
    func write(_ updates: [OutboxUpdate], tokens: [TokenMark]) async throws {
        guard !updates.isEmpty || !tokens.isEmpty else { return }
        var statements = [PostgresStatement("BEGIN")]
        if !updates.isEmpty {
            func column<T>(_ value: (OutboxUpdate) -> T?, _ encode: (T) -> PostgresValue) -> PostgresValue {
                .array(updates.map { value($0).map(encode) ?? .null })
            }
            statements.append(PostgresStatement("""
                UPDATE downstream_messages AS d SET
                    status = u.status,
                    attempts = greatest(d.attempts, coalesce(u.attempts, 0)),
                    sent_on = coalesce(u.sent_on, d.sent_on),
                    sent_at = coalesce(to_timestamp(u.sent_at), d.sent_at),
                    acked_at = coalesce(to_timestamp(u.acked_at), d.acked_at),
                    delivered_at = coalesce(to_timestamp(u.delivered_at), d.delivered_at),
                    error_code = coalesce(u.error_code, d.error_code),
                    error_description = coalesce(u.error_description, d.error_description),
                    canonical_token = coalesce(u.canonical_token, d.canonical_token),
                    token_results = coalesce(u.token_results::jsonb, d.token_results),
                    available_at = CASE WHEN u.status = 'delivered' THEN NULL
                                        -- A held-back `sent` carries the lease of its send: never shorten a renewal.
                                        WHEN u.status = 'sent' THEN greatest(d.available_at, to_timestamp(u.available_at))
                                        ELSE to_timestamp(u.available_at) END
                FROM unnest($1::bigint[], $2::text[], $3::int[], $4::text[], $5::float8[], $6::float8[],
                            $7::float8[], $8::text[], $9::text[], $10::text[], $11::float8[], $13::text[])
                    AS u(id, status, attempts, sent_on, sent_at, acked_at, delivered_at, error_code, error_description,
                         canonical_token, available_at, token_results)
                WHERE d.id = u.id AND (d.claimed_by = $12 OR u.status = 'delivered')
                """, [
                    .array(updates.map { .int($0.rowID) }), .array(updates.map { .text($0.status.rawValue) }),
                    column(\.attempts) { .int(Int64($0)) }, column(\.sentOn) { .text($0) },
                    // Times as Unix seconds: far cheaper for the server to read than timestamp text.
                    column(\.sentAt) { .double($0.timeIntervalSince1970) }, column(\.ackedAt) { .double($0.timeIntervalSince1970) },
                    column(\.deliveredAt) { .double($0.timeIntervalSince1970) }, column(\.errorCode) { .text($0) },
                    column(\.errorDescription) { .text($0) }, column(\.canonicalToken) { .text($0) },
                    column(\.availableAt) { .double($0.timeIntervalSince1970) }, .text(workerID),
                    column(\.tokenResults) { .text($0) },
                ]))
        }
        if !tokens.isEmpty {
            // One mark per token (an upsert may not touch a row twice).
            var latest: [String: TokenMark] = [:]
            var order: [String] = []
            for mark in tokens where latest.updateValue(mark, forKey: mark.token) == nil { order.append(mark.token) }
            let tokens = order.map { latest[$0]! }
            statements.append(PostgresStatement("""
                INSERT INTO device_tokens (token, state, canonical_token, error_code)
                SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[])
                ON CONFLICT (token) DO UPDATE SET state = excluded.state, canonical_token = excluded.canonical_token,
                    error_code = excluded.error_code, updated_at = now()
                """, [.array(tokens.map { .text($0.token) }), .array(tokens.map { .text($0.state.rawValue) }),
                      .array(tokens.map { $0.canonicalToken.map { .text($0) } ?? .null }),
                      .array(tokens.map { $0.errorCode.map { .text($0) } ?? .null })]))
        }
        statements.append(PostgresStatement("COMMIT"))
        try await pool.withConnection { connection in
            do {
                _ = try await connection.pipeline(statements)
            } catch {
                _ = try? await connection.execute("ROLLBACK")
                throw error
            }
        }
    }

    /// Extends this worker's lease on `ids` (rows it holds unsent, unanswered or in flight).
    func renew(_ ids: [Int64]) async throws {
        guard !ids.isEmpty else { return }
        _ = try await pool.withConnection { connection in
            try await connection.execute("""
                UPDATE downstream_messages SET available_at = now() + make_interval(secs => $3)
                WHERE id = ANY($1::bigint[]) AND claimed_by = $2 AND status IN ('sending', 'sent')
                """, [.array(ids.map { .int($0) }), .text(workerID), .double(lease.seconds)])
        }
    }
}
