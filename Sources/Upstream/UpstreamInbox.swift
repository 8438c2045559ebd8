import Foundation
import Postgres

/// The de-duplication record of upstream messages, in SQL: which message ids of a batch
/// were handled (or dead-lettered) before, recorded in the batch's own transaction.
///
/// A message counts as handled when its id is in `processed_upstream` or in a table a
/// handler declares as its `DeduplicationRecord` (the `store` handler's
/// `upstream_messages`). Every record is first tried as a plain INSERT, cheaper for
/// PostgreSQL than `ON CONFLICT DO NOTHING` (no check before each row, one WAL record less);
/// only a unique violation (a redelivery) opens the batch again carefully.
package struct UpstreamInbox: Sendable {
    /// The record handlers write for every message, when they are the only handlers.
    let recordOfEveryMessage: DeduplicationRecord?
    /// Every declared record, looked up besides `processed_upstream`.
    let records: [DeduplicationRecord]

    init(handlers: UpstreamHandlers) {
        recordOfEveryMessage = handlers.recordOfEveryMessage
        records = handlers.deduplicationRecords
    }

    /// True when a batch can go in one round trip: the handlers' rows are the records.
    func canCommitOptimistically(deadLettered: [PostgresValue]) -> Bool {
        recordOfEveryMessage != nil && deadLettered.isEmpty
    }

    /// The opening of the one-round-trip path: BEGIN, then a check that raises a unique
    /// violation when any of `ids` is in `processed_upstream` (dead-lettered, or handled
    /// while other handlers were configured). The handlers' rows follow, then COMMIT.
    func openOptimistically(_ ids: [PostgresValue], into transaction: UpstreamTransaction) {
        transaction.enqueue(PostgresStatement("BEGIN"))
        // The ids go as a literal, not a parameter: without parameters the check joins the
        // handlers' COPY (the `store` handler's) in one simple query, one round trip less.
        transaction.enqueue(PostgresStatement("""
            INSERT INTO processed_upstream (message_id)
            SELECT message_id FROM processed_upstream WHERE message_id = ANY(\(PostgresValue.array(ids).sqlLiteral)::text[])
            """))
    }

    /// Opens the batch's transaction and records `ids` in `processed_upstream`
    /// (`deadLettered` among them with that outcome). Returns the ids seen for the first
    /// time, or nil when that is all of them (the usual case).
    func openRecording(_ ids: [PostgresValue], deadLettered: [PostgresValue], on connection: PostgresConnection) async throws -> Set<String>? {
        do {
            var opening = [
                PostgresStatement("BEGIN"),
                PostgresStatement("""
                    INSERT INTO processed_upstream (message_id, outcome)
                    SELECT id, \(Self.outcome) FROM unnest($1::text[]) AS id
                    """, [.array(ids), .array(deadLettered)]),
            ]
            opening += records.map { PostgresStatement(Self.anyIn($0), [.array(ids)]) }
            let results = try await connection.pipeline(opening)
            if !results.dropFirst(2).contains(where: { $0.rows.first?.bool(0) == true }) { return nil }
        } catch let error as PostgresError where error.isUniqueViolation {}
        _ = try await connection.execute("ROLLBACK")
        return try await openRecordingCarefully(ids, deadLettered: deadLettered, on: connection)
    }

    /// Opens the batch's transaction, records `ids` in `processed_upstream` where they are
    /// not yet, and returns those seen for the first time (neither recorded nor in a
    /// handler's record), or nil when that is all of them.
    func openRecordingCarefully(_ ids: [PostgresValue], deadLettered: [PostgresValue],
                                on connection: PostgresConnection) async throws -> Set<String>? {
        var opening = [
            PostgresStatement("BEGIN"),
            PostgresStatement("""
                WITH recorded AS (
                    INSERT INTO processed_upstream (message_id, outcome)
                    SELECT id, \(Self.outcome) FROM unnest($1::text[]) AS id
                    ON CONFLICT DO NOTHING RETURNING message_id
                )
                SELECT array_agg(message_id) FROM recorded
                """, [.array(ids), .array(deadLettered)]),
        ]
        opening += records.map { record in
            PostgresStatement("SELECT array_agg(\(Self.quote(record.keyColumn))) FROM \(Self.quote(record.table)) "
                              + "WHERE \(Self.quote(record.keyColumn)) = ANY($1::text[])", [.array(ids)])
        }
        let results = try await connection.pipeline(opening)
        let recorded = Set(results[1].rows.first?.strings(0) ?? [])
        let handled = results.dropFirst(2).reduce(into: Set<String>()) { $0.formUnion($1.rows.first?.strings(0) ?? []) }
        let firstSeen = recorded.subtracting(handled)
        return firstSeen.count == ids.count ? nil : firstSeen
    }

    /// Queues the dead letters' rows.
    func enqueue(_ letters: [UpstreamWork.DeadLetter], into transaction: UpstreamTransaction) {
        for letter in letters {
            transaction.enqueue(PostgresStatement("""
                INSERT INTO dead_letters (message_id, from_token, category, raw_payload, reason, error, attempts, received_at,
                                          handler, code)
                VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
                """, [letter.messageID.map { .text($0) } ?? .null, letter.from.map { .text($0) } ?? .null,
                      letter.category.map { .text($0) } ?? .null, .text(letter.rawPayload), .text(letter.reason),
                      letter.error.map { .text($0) } ?? .null, .int(Int64(letter.attempts)), .timestamptz(letter.receivedAt),
                      letter.handler.map { .text($0) } ?? .null, letter.code.map { .text($0) } ?? .null]))
        }
    }

    /// `processed_upstream.outcome` of id: `dead_lettered` for those in $2.
    private static let outcome = "CASE WHEN id = ANY($2::text[]) THEN 'dead_lettered' ELSE 'handled' END"

    /// Whether any of the ids ($1) is in `record`.
    private static func anyIn(_ record: DeduplicationRecord) -> String {
        "SELECT EXISTS (SELECT 1 FROM \(quote(record.table)) WHERE \(quote(record.keyColumn)) = ANY($1::text[]))"
    }

    private static func quote(_ identifier: String) -> String { PostgresConnection.quoteIdentifier(identifier) }
}
