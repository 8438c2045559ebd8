import FCM
import Foundation
import Postgres
import Runtime
import XMPP

/// The outbox table as the sender uses it: claiming rows in batches under a lease, writing
/// their delivery state back, renewing and releasing claims, and marking tokens.
///
/// A claim is a row of `outbox_claims` naming a batch of rows (`fcm_outbox_claim`: rows no
/// claim saw yet; `fcm_outbox_sweep`: rows due again behind them, and the rows of expired
/// claims); the rows themselves are written once, with their answer. Claims of a transport
/// are made one at a time, so several workers on one database never claim the same row; a
/// claim lasts `lease` unless renewed, after which another worker's sweep takes its rows
/// over (its worker crashed, or lost the database for that long). State is written back
/// only for rows whose claim this worker still holds (receipts excepted); a write that
/// settles a claim's last rows deletes the claim. Migration 0007 has the details.
package struct OutboxStore: Sendable {
    package let pool: PostgresPool
    /// Who claims: written to `claimed_by`.
    package let workerID: String
    package let lease: Duration
    /// The rows this store claims: `xmpp` or `http`.
    package var transport: String
    /// This worker's claims, shared by both transports' stores.
    package let ledger: ClaimLedger

    package init(pool: PostgresPool, workerID: String, lease: Duration, transport: String, ledger: ClaimLedger = ClaimLedger()) {
        self.pool = pool
        self.workerID = workerID
        self.lease = lease
        self.transport = transport
        self.ledger = ledger
    }

    /// A claimed row, with what `device_tokens` knows about its target.
    package struct ClaimedRow: Sendable {
        package let id: Int64
        package let target: String?
        package let condition: String?
        package let payload: String
        /// Times sent before this claim.
        package let attempts: Int
        package let createdAt: Date
        package let tokenState: TokenMark.State?
        package let tokenErrorCode: String?
        package let canonicalToken: String?
        /// The tokens of a multicast row (HTTP only).
        package let registrationIDs: [String]?
        /// Per-token outcomes of earlier attempts (HTTP multicast), as JSON text.
        package let tokenResults: String?
    }

    /// Claims up to `limit` due rows: when `sweeping`, first those due again behind the
    /// claims' frontier (retries, rows handed back, rows of expired claims: a sender sweeps
    /// every sweep interval and when a retry falls due), then rows no claim saw yet; in id
    /// order.
    package func claim(limit: Int, sweeping: Bool = false) async throws -> [ClaimedRow] {
        let rows = try await pool.withConnection { connection in
            try await connection.query(sweeping ? "SELECT * FROM fcm_outbox_sweep($1, $2, $3, $4)" : "SELECT * FROM fcm_outbox_claim($1, $2, $3, $4)",
                                       [.text(workerID), .text(transport), .int(Int64(limit)), .double(lease.seconds)])
        }
        var claims: [Int64: [Int64]] = [:]
        let claimed = rows.map { row in
            let id = row.int(1) ?? 0
            if let claim = row.int(0) { claims[claim, default: []].append(id) }
            return ClaimedRow(id: id, target: row.string(2), condition: row.string(3), payload: row.string(4) ?? "{}",
                              attempts: Int(row.int(5) ?? 0), createdAt: Date(timeIntervalSince1970: row.double(6) ?? 0),
                              tokenState: row.string(7).flatMap(TokenMark.State.init(rawValue:)), tokenErrorCode: row.string(8),
                              canonicalToken: row.string(9), registrationIDs: row.strings(10), tokenResults: row.string(11))
        }.sorted { $0.id < $1.id }   // The functions return them unordered (migration 0008): in id order, per-device order holds.
        for (claim, ids) in claims { ledger.add(claim: claim, rows: ids) }
        return claimed
    }

    /// Writes `updates` (one per row) and `tokens` (one per token) in one transaction.
    package func write(_ updates: [OutboxUpdate], tokens: [TokenMark]) async throws {
        guard !updates.isEmpty || !tokens.isEmpty else { return }
        var statements = [PostgresStatement("BEGIN")]
        let plan = ledger.plan(updates)
        if !updates.isEmpty {
            let split = Self.split(updates, under: plan)
            if !split.plain.updates.isEmpty { statements.append(plainAcks(split.plain.updates, claims: split.plain.claims)) }
            if !split.other.updates.isEmpty { statements.append(general(split.other.updates, claims: split.other.claims)) }
            let emptied = plan.emptied
            if !emptied.isEmpty {
                statements.append(PostgresStatement("DELETE FROM outbox_claims WHERE id = ANY($1::bigint[]) AND worker = $2",
                                                    [.array(emptied.map { .int($0) }), .text(workerID)]))
            }
            if !split.dueAgain.rows.isEmpty {
                statements.append(PostgresStatement("""
                    UPDATE outbox_claims SET row_ids = ARRAY(SELECT r FROM unnest(row_ids) AS r WHERE r <> ALL($1::bigint[]))
                    WHERE id = ANY($2::bigint[]) AND worker = $3
                    """, [.array(split.dueAgain.rows.map { .int($0) }), .array(Set(split.dueAgain.claims).sorted().map { .int($0) }),
                          .text(workerID)]))
            }
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
        ledger.written(updates, under: plan)
    }

    /// What a write of `updates` under `plan` sends where.
    private struct WriteSplit {
        /// Plain acks (`isPlainAck`), with their claims.
        var plain: (updates: [OutboxUpdate], claims: [Int64]) = ([], [])
        /// The other updates, with their claims (nil: no live claim).
        var other: (updates: [OutboxUpdate], claims: [Int64?]) = ([], [])
        /// Rows due again (a retry, a hand-back) whose claim lives on, and those claims.
        var dueAgain: (rows: [Int64], claims: [Int64]) = ([], [])
    }

    /// Most answers are plain acks: written by a statement that reads five columns instead of
    /// thirteen (parsing the text arrays was about 2.5 µs a row), and sets no column it leaves
    /// as it was; everything else goes through the general one. A row due again leaves a
    /// claim that lives on (not emptied by this write), so that a sweep can take it before
    /// the claim's other rows are answered: its row is taken out of that claim.
    ///
    /// Not async, and each update read where it lies: iterated in the async `write`, each was
    /// copied whole first (a dozen fields' reference counts up and down).
    @inline(never)
    private static func split(_ updates: [OutboxUpdate], under plan: ClaimLedger.WritePlan) -> WriteSplit {
        var split = WriteSplit()
        let emptied = Set(plan.emptied)
        updates.withUnsafeBufferPointer { buffer in
            for (index, claim) in zip(buffer.indices, plan.claims) {
                let update = buffer.baseAddress! + index
                if let claim, isPlainAck(update.pointee, claim: claim) {
                    split.plain.updates.append(update.pointee)
                    split.plain.claims.append(claim)
                } else {
                    split.other.updates.append(update.pointee)
                    split.other.claims.append(claim)
                }
                if update.pointee.status == .retry || update.pointee.status == .pending, let claim, !emptied.contains(claim) {
                    split.dueAgain.rows.append(update.pointee.rowID)
                    split.dueAgain.claims.append(claim)
                }
            }
        }
        return split
    }

    /// Whether `update` is a plain ack of a claimed row (with its `token_results` or
    /// `message_name` or not):
    /// what `plainAcks` writes.
    package static func isPlainAck(_ update: OutboxUpdate, claim: Int64?) -> Bool {
        update.status == .acked && claim != nil && update.attempts != nil && update.sentOn != nil && update.sentAt != nil
            && update.ackedAt != nil && update.deliveredAt == nil && update.errorCode == nil && update.errorDescription == nil
            && update.canonicalToken == nil && update.availableAt == nil
    }

    /// Writes acks (`isPlainAck`) of rows whose claims this worker still holds; the claims
    /// are held FOR SHARE, as in `general`. Times go as microseconds since 1970: integers
    /// cost less to write and to parse than floating-point seconds, and say the same.
    private func plainAcks(_ updates: [OutboxUpdate], claims: [Int64]) -> PostgresStatement {
        PostgresStatement("""
            WITH live AS (SELECT c.id FROM outbox_claims AS c WHERE c.id = ANY($6::bigint[]) AND c.worker = $7 FOR SHARE)
            UPDATE downstream_messages AS d SET
                status = 'acked', claimed_by = $7, attempts = greatest(d.attempts, u.attempts), sent_on = u.sent_on,
                sent_at = to_timestamp(u.sent_us::float8 / 1000000), acked_at = to_timestamp(u.acked_us::float8 / 1000000),
                available_at = NULL, error_code = NULL, error_description = NULL,
                token_results = coalesce(u.token_results::jsonb, d.token_results),
                message_name = coalesce(u.message_name, d.message_name)
            FROM unnest($1::bigint[], $2::int[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[], $8::text[], $9::text[])
                AS u(id, attempts, sent_on, sent_us, acked_us, claim, token_results, message_name)
            WHERE d.id = u.id AND u.claim IN (SELECT id FROM live)
            """, [
                .array(updates.map { .int($0.rowID) }), .array(updates.map { .int(Int64($0.attempts ?? 0)) }),
                .array(updates.map { .text($0.sentOn ?? "") }),
                .array(updates.map { .int(Self.microseconds($0.sentAt)) }),
                .array(updates.map { .int(Self.microseconds($0.ackedAt)) }),
                .array(claims.map { .int($0) }), .text(workerID),
                .array(updates.map { $0.tokenResults.map { .text($0) } ?? .null }),
                .array(updates.map { $0.messageName.map { .text($0) } ?? .null }),
            ])
    }

    /// `date` in whole microseconds since 1970 (PostgreSQL keeps no finer time); 0 for nil.
    package static func microseconds(_ date: Date?) -> Int64 {
        guard let date else { return 0 }
        return Int64((date.timeIntervalSince1970 * 1_000_000).rounded())
    }

    /// Writes any updates: the columns an update leaves nil keep their values. An update
    /// counts only under a live claim of this worker, but for a receipt of a row sent
    /// already (sent, acked or delivered), which may come after its claim is gone.
    private func general(_ updates: [OutboxUpdate], claims: [Int64?]) -> PostgresStatement {
        func column<T>(_ value: (OutboxUpdate) -> T?, _ encode: (T) -> PostgresValue) -> PostgresValue {
            .array(updates.map { value($0).map(encode) ?? .null })
        }
        // The claims are held FOR SHARE: a sweep taking them over waits for this write
        // (and then finds its rows written); after a takeover, nothing is written.
        return PostgresStatement("""
            WITH live AS (SELECT c.id FROM outbox_claims AS c WHERE c.id = ANY($14::bigint[]) AND c.worker = $12 FOR SHARE)
            UPDATE downstream_messages AS d SET
                status = u.status,
                claimed_by = CASE WHEN u.claim IS NULL THEN d.claimed_by ELSE $12 END,
                attempts = greatest(d.attempts, coalesce(u.attempts, 0)),
                sent_on = coalesce(u.sent_on, d.sent_on),
                sent_at = coalesce(to_timestamp(u.sent_at), d.sent_at),
                acked_at = coalesce(to_timestamp(u.acked_at), d.acked_at),
                delivered_at = coalesce(to_timestamp(u.delivered_at), d.delivered_at),
                -- An answer of success keeps no error of an earlier attempt.
                error_code = CASE WHEN u.status IN ('acked', 'delivered') THEN u.error_code
                                  ELSE coalesce(u.error_code, d.error_code) END,
                error_description = CASE WHEN u.status IN ('acked', 'delivered') THEN u.error_description
                                         ELSE coalesce(u.error_description, d.error_description) END,
                canonical_token = coalesce(u.canonical_token, d.canonical_token),
                token_results = coalesce(u.token_results::jsonb, d.token_results),
                message_name = coalesce(u.message_name, d.message_name),
                available_at = CASE WHEN u.status = 'delivered' THEN NULL
                                    -- Still in flight: its claim keeps it from other claims.
                                    WHEN u.status = 'sent' THEN d.available_at
                                    ELSE to_timestamp(u.available_at) END
            FROM unnest($1::bigint[], $2::text[], $3::int[], $4::text[], $5::float8[], $6::float8[],
                        $7::float8[], $8::text[], $9::text[], $10::text[], $11::float8[], $13::text[], $14::bigint[], $15::text[])
                AS u(id, status, attempts, sent_on, sent_at, acked_at, delivered_at, error_code, error_description,
                     canonical_token, available_at, token_results, claim, message_name)
            WHERE d.id = u.id AND (u.claim IN (SELECT id FROM live)
                                   -- A receipt without a claim counts for a row that was sent: after the
                                   -- outbox was emptied and its ids reused, one for an old message would
                                   -- mark a new row, never sent, as delivered.
                                   OR (u.status = 'delivered' AND d.status IN ('sent', 'acked', 'delivered')))
            """, [
                .array(updates.map { .int($0.rowID) }), .array(updates.map { .text($0.status.rawValue) }),
                column(\.attempts) { .int(Int64($0)) }, column(\.sentOn) { .text($0) },
                // Times as Unix seconds: far cheaper for the server to read than timestamp text.
                column(\.sentAt) { .double($0.timeIntervalSince1970) }, column(\.ackedAt) { .double($0.timeIntervalSince1970) },
                column(\.deliveredAt) { .double($0.timeIntervalSince1970) }, column(\.errorCode) { .text($0) },
                column(\.errorDescription) { .text($0) }, column(\.canonicalToken) { .text($0) },
                column(\.availableAt) { .double($0.timeIntervalSince1970) }, .text(workerID),
                column(\.tokenResults) { .text($0) }, .array(claims.map { $0.map { .int($0) } ?? .null }),
                column(\.messageName) { .text($0) },
            ])
    }

    /// Extends the lease of every claim this worker holds. Returns the rows of claims that
    /// were gone (expired and taken over by another worker's sweep): they are forgotten, and
    /// what is written for those rows later changes nothing.
    @discardableResult
    package func renewClaims() async throws -> Int {
        let claims = ledger.claimIDs
        guard !claims.isEmpty else { return 0 }
        let renewed = try await pool.withConnection { connection in
            try await connection.query("""
                UPDATE outbox_claims SET expires_at = now() + make_interval(secs => $3)
                WHERE id = ANY($1::bigint[]) AND worker = $2 RETURNING id
                """, [.array(claims.map { .int($0) }), .text(workerID), .double(lease.seconds)])
        }
        let alive = Set(renewed.compactMap { $0.int(0) })
        return ledger.forget(claims.filter { !alive.contains($0) })
    }

    /// Finds the rows no claim would ever see: still `pending`, at or below their
    /// transport's frontier, in no claim and not due again, queued over `olderThan` ago (a
    /// row whose id was taken before its transaction wrote, e.g. by an explicit `nextval()`
    /// or a reused id, which the docs ask applications not to do). They are put among the
    /// rows due again, so that the next claim takes them. Returns their ids by transport.
    package static func rescueStrandedRows(on connection: PostgresConnection, olderThan: Duration) async throws -> [(transport: String, id: Int64)] {
        try await connection.query("""
            INSERT INTO outbox_due_again (transport, id, due_at)
            SELECT d.transport, d.id, d.available_at
            FROM downstream_messages AS d
                 JOIN outbox_cursors AS c ON c.transport = d.transport AND d.id <= c.frontier
            WHERE d.status = 'pending' AND d.available_at IS NOT NULL
              AND d.created_at < now() - make_interval(secs => $1)
              AND NOT EXISTS (SELECT 1 FROM outbox_due_again AS e WHERE e.transport = d.transport AND e.id = d.id)
              AND NOT EXISTS (SELECT 1 FROM outbox_claims AS k WHERE k.transport = d.transport AND d.id = ANY (k.row_ids))
            ON CONFLICT (transport, id) DO NOTHING
            RETURNING transport, id
            """, [.double(olderThan.seconds)]).map { ($0.string(0) ?? "", $0.int(1) ?? 0) }
    }
}
