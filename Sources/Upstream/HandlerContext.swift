import FCM
import Foundation
import Postgres
import Runtime

/// What a batch handler may touch: the batch's transaction, downstream messages, actions
/// after the commit, and a logger.
///
/// What runs once and what may run again: every effect made through the context (`execute`,
/// `send`, `reply`) commits together with the message's de-duplication record, exactly once
/// per `message_id`, or not at all. The handler's own code may run more than once for a
/// message: after a failure (its transaction rolled back) and when a failing batch is
/// retried message by message. Side effects outside the database belong in `afterCommit`.
///
/// Valid only during the `handle` call it was given to.
public class BatchContext {
    /// A logger labelled with the handler's name.
    public let logger: Logger
    /// Where the effects go.
    public let transaction: any HandlerTransaction

    /// A context over `transaction` (the worker makes its own; tests pass a recording one).
    public init(logger: Logger, transaction: any HandlerTransaction) {
        self.logger = logger
        self.transaction = transaction
    }

    /// Queues a statement in the transaction: it is sent, pipelined with the others, before
    /// the next `query`/`executeNow` or at commit. Its error surfaces there: thrown by that
    /// `query` (which then did not run), or failing the commit, when the batch rolls back
    /// and its messages are retried one by one (so the failing one is the one retried and
    /// dead-lettered). Use `executeNow` to see the error, or the row count, at the call.
    public func execute(_ sql: String, _ parameters: [PostgresValue] = []) {
        transaction.enqueue(PostgresStatement(sql, parameters))
    }

    /// Queues `rows` for `table` as one `COPY … FROM STDIN` in the transaction, sent like
    /// `execute`'s statements: PostgreSQL's cheapest way to add many rows (it skips a
    /// multi-row INSERT's per-row executor work and WAL; index upkeep stays), for a batch
    /// handler that adds a row per message.
    /// Each row holds one value per column. COPY has no `ON CONFLICT`: a row that breaks a
    /// constraint fails the commit, and the batch is retried message by message as with any
    /// failing statement. Table and column names are quoted here (pass them unquoted).
    public func copy(into table: String, columns: [String], rows: [[PostgresValue]]) {
        transaction.enqueue(.copy(into: table, columns: columns, rows: rows))
    }

    /// `copy(into:columns:rows:)` with the rows' values in one list, one row after another
    /// (`columns.count` values each): no list per row, which is one allocation less per
    /// message. A count that is not a whole number of rows fails the statement, and so the
    /// commit, before anything is sent.
    public func copy(into table: String, columns: [String], values: [PostgresValue]) {
        transaction.enqueue(.copy(into: table, columns: columns, values: values))
    }

    /// `execute` with Swift values as parameters (`String`, `Int`, `Double`, `Bool`,
    /// `Date`, `Data`, `UUID`, arrays of them, optionals, or `PostgresValue`).
    public func execute(_ sql: String, _ first: any PostgresValueConvertible, _ rest: any PostgresValueConvertible...) {
        execute(sql, [first.postgresValue] + rest.map(\.postgresValue))
    }

    /// Runs a statement now (after the queued ones) and returns the rows it affected.
    /// - Throws: its `PostgresError`, or that of a queued statement before it.
    @discardableResult
    public func executeNow(_ sql: String, _ parameters: [PostgresValue] = []) async throws -> Int {
        try await transaction.run(PostgresStatement(sql, parameters)).affectedRows
    }

    /// Runs a query now in the transaction (after the queued statements) and returns its rows.
    public func query(_ sql: String, _ parameters: [PostgresValue] = []) async throws -> [PostgresRow] {
        try await transaction.run(PostgresStatement(sql, parameters)).rows
    }

    /// `query`, each row decoded into `type` by column name (see `PostgresRowDecoder`).
    public func query<Row: Decodable>(_ type: Row.Type, _ sql: String, _ parameters: [PostgresValue] = []) async throws -> [Row] {
        try await query(sql, parameters).map { try $0.decode(type) }
    }

    /// Queues a downstream message after checking it against FCM's rules: an outbox row in
    /// this transaction, sent once it commits.
    /// - Throws: `DownstreamValidationError` naming the field FCM would refuse (nothing is queued).
    public func send(_ message: OutgoingMessage) throws(DownstreamValidationError) {
        try message.validate()
        transaction.send(message)
    }

    /// Queues a downstream message to `target` (a token, notification key or `/topics/…`).
    /// `options` are FCM's fields such as `time_to_live`, `priority` or `notification`.
    /// - Throws: `DownstreamValidationError` (nothing is queued).
    public func send(to target: String, data: [String: JSONValue], options: [String: JSONValue] = [:],
                     transport: OutgoingMessage.Transport? = nil) throws(DownstreamValidationError) {
        try send(OutgoingMessage(.to(target), data: data, options: options, transport: transport, sourceMessageID: sourceMessageID))
    }

    /// Queues a message to the devices subscribed to the topics `condition` selects.
    /// - Throws: `DownstreamValidationError` (nothing is queued).
    public func send(condition: String, data: [String: JSONValue], options: [String: JSONValue] = [:],
                     transport: OutgoingMessage.Transport? = nil) throws(DownstreamValidationError) {
        try send(OutgoingMessage(.condition(condition), data: data, options: options, transport: transport,
                                 sourceMessageID: sourceMessageID))
    }

    /// Queues one message to up to 1,000 tokens: a legacy HTTP multicast, or with
    /// `transport: .v1` one v1 request per token (each token's answer in `token_results`).
    /// - Throws: `DownstreamValidationError` (nothing is queued).
    public func sendMulticast(to tokens: [String], data: [String: JSONValue], options: [String: JSONValue] = [:],
                              transport: OutgoingMessage.Transport? = nil) throws(DownstreamValidationError) {
        try send(OutgoingMessage(.multicast(tokens), data: data, options: options, transport: transport, sourceMessageID: sourceMessageID))
    }

    /// Runs `action` once the transaction has committed, on the message's lane (the lane
    /// waits for it: keep it short), after the durable ack if any. It runs at most once:
    /// not when the transaction rolls back (the handler runs again and registers it again),
    /// and not when the process dies between the commit and it. An effect that must happen
    /// belongs in the database (an outbox row, a table another process polls).
    public func afterCommit(_ action: @escaping @Sendable () async -> Void) {
        transaction.afterCommit(action)
    }

    /// The upstream message downstream messages answer (nil for a batch).
    var sourceMessageID: String? { nil }

    /// A per-message context sharing this transaction (for `reply`).
    public func context(for message: UpstreamMessage) -> HandlerContext {
        HandlerContext(message: message, logger: logger, transaction: transaction)
    }
}

/// What a handler may touch while it handles one message: the message's transaction
/// (`execute`, `query`), downstream messages (`reply`, `send`), actions after the commit,
/// a logger, and the message. See `BatchContext` for what runs once and what may run again.
///
/// Valid only during the `handle` call it was given to.
public final class HandlerContext: BatchContext {
    /// The message being handled.
    public let message: UpstreamMessage

    /// A context for `message` over `transaction` (the worker makes its own; tests pass a
    /// recording one).
    public init(message: UpstreamMessage, logger: Logger, transaction: any HandlerTransaction) {
        self.message = message
        super.init(logger: logger, transaction: transaction)
    }

    override var sourceMessageID: String? { message.messageID }

    /// Queues a downstream message to the sender of this message. `options` are FCM's
    /// fields such as `time_to_live`, `priority` or `notification`; `transport` the one that
    /// carries it (nil: the outbox's default; `.v1` for FCM's HTTP v1 API, the one that
    /// reaches devices today).
    /// - Throws: `DownstreamValidationError` naming the field FCM would refuse (nothing is queued).
    public func reply(data: [String: JSONValue], options: [String: JSONValue] = [:],
                      transport: OutgoingMessage.Transport? = nil) throws(DownstreamValidationError) {
        try send(to: message.from, data: data, options: options, transport: transport)
    }
}
