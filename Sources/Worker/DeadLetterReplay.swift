import FCM
import Foundation
import Postgres
import Runtime
import Upstream
import Synchronization

/// `dead-letters replay`: runs dead-lettered messages through the handlers again, each
/// exactly once: the message's dead-letter record in `processed_upstream` is removed, the
/// message goes through the upstream pipeline like a spooled one (its effects commit with
/// a new record), and the dead letter is marked `replayed_at`. A replay cut short is safe
/// to run again: a message handled meanwhile counts as a duplicate and is only marked.
///
/// Only messages dead-lettered by their handlers (`handler_failed`) or by the routes
/// (`unrouted`: no handler's route matched) can be replayed: the others (`unackable`,
/// `unreadable`, `unknown_type`, `oversized`) never were messages a handler can take.
struct DeadLetterReplay: Sendable {
    let configuration: WorkerConfiguration
    let handlers: UpstreamHandlers
    let logger: Logger

    /// A row of `dead_letters`.
    struct Letter: Sendable {
        var id: Int64
        var messageID: String?
        var from: String?
        var reason: String
        var error: String?
        var attempts: Int
        var createdAt: Date?
        var replayedAt: Date?
        var rawPayload: String
        /// The handler that refused it or failed it last.
        var handler: String?
        /// Its refusal's reason code (a `PermanentFailure`'s code).
        var code: String?

        /// Whether `replay` can run it through the handlers again.
        var isReplayable: Bool { Self.replayableReasons.contains(reason) && messageID != nil }

        static let replayableReasons = ["handler_failed", "unrouted"]

        var json: JSONValue {
            ["id": JSONValue(Int(id)), "message_id": messageID.map { .string($0) } ?? .null, "from": from.map { .string($0) } ?? .null,
             "reason": .string(reason), "handler": handler.map { .string($0) } ?? .null, "code": code.map { .string($0) } ?? .null,
             "error": error.map { .string($0) } ?? .null, "attempts": JSONValue(attempts),
             "created_at": createdAt.map { .string($0.formatted(.iso8601)) } ?? .null,
             "replayed_at": replayedAt.map { .string($0.formatted(.iso8601)) } ?? .null]
        }

        var line: String {
            "\(id)  \(createdAt?.formatted(.iso8601) ?? "?")  \(reason)\(code.map { "/\($0)" } ?? "")  \(messageID ?? "-")"
                + (handler.map { "  handler \($0)" } ?? "") + "  attempts \(attempts)"
                + (replayedAt.map { "  replayed \($0.formatted(.iso8601))" } ?? "") + "  \(error.map { String($0.prefix(120)) } ?? "")"
        }
    }

    struct Outcome: Sendable {
        var replayed: [Int64] = []
        var failedAgain: [Int64] = []
        var skipped: [(id: Int64, reason: String)] = []
    }

    private static let columns = "id, message_id, from_token, reason, error, attempts, created_at, replayed_at, raw_payload, handler, code"

    private static func letter(_ row: PostgresRow) -> Letter {
        Letter(id: row.int(0) ?? 0, messageID: row.string(1), from: row.string(2), reason: row.string(3) ?? "", error: row.string(4),
               attempts: Int(row.int(5) ?? 0), createdAt: row.date(6), replayedAt: row.date(7), rawPayload: row.string(8) ?? "",
               handler: row.string(9), code: row.string(10))
    }

    static func list(on connection: PostgresConnection, limit: Int) async throws -> [Letter] {
        try await connection.query("SELECT \(columns) FROM dead_letters ORDER BY id DESC LIMIT $1", [.int(Int64(limit))]).map(letter)
    }

    /// Replays the dead letters `ids` (nil: every one not replayed yet that handlers can take).
    func run(ids: [Int64]?) async throws -> Outcome {
        guard let url = configuration.databaseURL else { throw ConfigurationError("missing database URL") }
        let target: PostgresConnectionString
        do { target = try PostgresConnectionString(url) } catch { throw ConfigurationError(error.message) }
        let pool = PostgresPool(target: target, size: configuration.concurrency + 1, connectTimeout: configuration.databaseConnectTimeout,
                                callTimeout: configuration.databaseTimeout, preparesStatements: false)
        do {
            let outcome = try await replay(ids: ids, pool: pool)
            await pool.close()
            return outcome
        } catch {
            await pool.close()
            throw error
        }
    }

    private func replay(ids: [Int64]?, pool: PostgresPool) async throws -> Outcome {
        let migrator = try configuration.migrator()
        let letters = try await pool.withConnection { connection -> [Letter] in
            let pending = try await migrator.pending(connection)
            guard pending.isEmpty else {
                throw ConfigurationError("\(pending.count) pending migration(s) (\(pending.joined(separator: ", "))): run migrate first")
            }
            if let ids {
                return try await connection.query("SELECT \(Self.columns) FROM dead_letters WHERE id = ANY($1::bigint[]) ORDER BY id",
                                                  [.array(ids.map { .int($0) })]).map(Self.letter)
            }
            return try await connection.query("""
                SELECT \(Self.columns) FROM dead_letters WHERE replayed_at IS NULL AND reason = ANY($1::text[]) ORDER BY id
                """, [.array(Letter.replayableReasons.map { .text($0) })]).map(Self.letter)
        }
        var outcome = Outcome()
        for id in ids ?? [] where !letters.contains(where: { $0.id == id }) { outcome.skipped.append((id, "no such dead letter")) }
        var work: [(letter: Letter, work: UpstreamWork)] = []
        for letter in letters {
            if let replayed = letter.replayedAt {
                outcome.skipped.append((letter.id, "replayed already, at \(replayed.formatted(.iso8601))"))
                continue
            }
            guard letter.isReplayable else {
                outcome.skipped.append((letter.id, "a \(letter.reason) dead letter is not a message a handler can take"))
                continue
            }
            let item = FCMWorker.work(from: Spool.Entry(connection: "replay", payload: letter.rawPayload,
                                                        receivedAt: (letter.createdAt ?? Date()).timeIntervalSince1970))
            guard case .message = item.kind else {
                outcome.skipped.append((letter.id, "its payload is not an upstream message"))
                continue
            }
            work.append((letter, item))
        }
        guard !work.isEmpty else { return outcome }

        let messageIDs = work.compactMap { $0.letter.messageID }
        _ = try await pool.withConnection { connection in
            try await connection.execute("DELETE FROM processed_upstream WHERE message_id = ANY($1::text[]) AND outcome = 'dead_lettered'",
                                         [.array(messageIDs.map { .text($0) })])
        }
        let deadAgain = BlockingLock(Set<String>())
        var settings = configuration.pipeline
        settings.retryBase = .milliseconds(100)
        settings.retryCap = .seconds(2)
        let pipeline = UpstreamPipeline(pool: pool, handlers: handlers, settings: settings, logger: logger.labeled("replay"),
                                        observer: { event in
                                            if case .committed(_, _, let letters) = event { deadAgain.withLock { $0.formUnion(letters) } }
                                        }, metrics: WorkerMetrics())
        async let lanes = pipeline.run()
        await pipeline.submit(work.map(\.work))
        pipeline.close()
        let leftovers = await lanes
        guard leftovers.isEmpty else { throw ConfigurationError("replay interrupted: \(leftovers.count) message(s) not committed; run it again") }
        let failed = deadAgain.withLock { $0 }
        for (letter, _) in work {
            if failed.contains(letter.messageID ?? "") { outcome.failedAgain.append(letter.id) } else { outcome.replayed.append(letter.id) }
        }
        _ = try await pool.withConnection { connection in
            try await connection.execute("UPDATE dead_letters SET replayed_at = now() WHERE id = ANY($1::bigint[])",
                                         [.array(work.map { .int($0.letter.id) })])
        }
        return outcome
    }
}
