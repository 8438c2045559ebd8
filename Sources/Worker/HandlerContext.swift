import FCM
import Foundation
import Postgres
import Runtime

/// What a batch handler may touch: the batch's transaction, replies, and a logger.
///
/// Valid only during the `handle` call it was given to.
public class BatchContext {
    /// A logger labelled with the handler's name.
    public let logger: Logger
    let transaction: UpstreamTransaction

    init(logger: Logger, transaction: UpstreamTransaction) {
        self.logger = logger
        self.transaction = transaction
    }

    /// Queues a statement in the transaction. It runs before the next `query` or at
    /// commit; if it fails, the handling fails (and is retried).
    public func execute(_ sql: String, _ parameters: [PostgresValue] = []) {
        transaction.enqueue(PostgresStatement(sql, parameters))
    }

    /// Runs a query now in the transaction and returns its rows.
    public func query(_ sql: String, _ parameters: [PostgresValue] = []) async throws -> [PostgresRow] {
        try await transaction.query(PostgresStatement(sql, parameters))
    }

    /// A per-message context sharing this transaction (for `reply`).
    public func context(for message: UpstreamMessage) -> HandlerContext {
        HandlerContext(message: message, logger: logger, transaction: transaction)
    }
}

/// What a handler may touch while it handles one message: the message's transaction
/// (`execute`, `query`), downstream replies (outbox rows in the same transaction), a
/// logger, and the message.
///
/// Valid only during the `handle` call it was given to.
public final class HandlerContext: BatchContext {
    /// The message being handled.
    public let message: UpstreamMessage

    init(message: UpstreamMessage, logger: Logger, transaction: UpstreamTransaction) {
        self.message = message
        super.init(logger: logger, transaction: transaction)
    }

    /// Queues a downstream message to the sender of this message: an outbox row written in
    /// this transaction (sent once it commits). `options` are FCM fields such as
    /// `time_to_live` or `priority`.
    public func reply(data: [String: JSONValue], options: [String: JSONValue] = [:]) {
        send(to: message.from, data: data, options: options)
    }

    /// Queues a downstream message to `target` (a token, notification key or `/topics/…`).
    public func send(to target: String, data: [String: JSONValue], options: [String: JSONValue] = [:]) {
        OutboxInsert.enqueue(target: target, data: data, options: options, source: message.messageID, into: transaction)
    }
}

/// Writing downstream messages into the outbox table.
enum OutboxInsert {
    static func enqueue(target: String, data: [String: JSONValue], options: [String: JSONValue], source: String?,
                        into transaction: UpstreamTransaction) {
        var payload = options
        payload["data"] = .object(data)
        transaction.enqueue(PostgresStatement(
            "INSERT INTO downstream_messages (target, payload, source_message_id) VALUES ($1, $2::jsonb, $3)",
            [.text(target), .jsonb(JSONValue.object(payload).serialized), source.map { .text($0) } ?? .null]))
    }
}
