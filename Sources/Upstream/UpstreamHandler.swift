/// Your code for upstream messages. Implement it in your own module and register it.
///
/// The contract:
/// - `handle` runs inside a database transaction that also records the message as
///   processed. If it returns, its effects through `context` (`execute`, `reply`, `send`)
///   commit together with that record: **exactly once** per `message_id`, even when CCS
///   redelivers or the worker restarts.
/// - The handler's **code may run more than once** for a message: when it throws, when
///   another message of its batch fails (the batch rolls back and its messages are handled
///   again one by one), and after a crash before the commit. Keep side effects outside
///   the database in `context.afterCommit`, which runs at most once, after the commit.
/// - If it throws, its effects roll back and the message is retried with backoff
///   (`--max-attempts`, 5 by default), then dead-lettered. `PermanentFailure` (and a
///   `DownstreamValidationError` from `reply`/`send`) dead-letters it at once: no retries,
///   and the rest of its batch commits without being handled one by one.
/// - Messages from one device reach a handler in arrival order, one at a time.
/// - A handler registered with a `timeout` is cancelled when it runs longer; the attempt
///   counts as failed (and is retried) once it returns.
public protocol UpstreamHandler: Sendable {
    func handle(_ message: UpstreamMessage, in context: HandlerContext) async throws

    /// Looks at a message before its batch, outside any transaction: throw
    /// `PermanentFailure` for one this handler can never take (the `store` handler refuses
    /// data `jsonb` cannot hold), and it is dead-lettered at once, alone, instead of failing
    /// its batch. The default accepts every message.
    func check(_ message: UpstreamMessage) throws
}

extension UpstreamHandler {
    public func check(_ message: UpstreamMessage) throws {}
}

/// A handler that can take many messages in one call, for bulk writes (the built-in
/// `store` handler writes a whole batch with one statement). The worker calls
/// `handle(batch:in:)` with the matching messages of a batch, in arrival order; it falls
/// back to `handle(_:in:)` one message at a time to isolate a failure.
public protocol BatchUpstreamHandler: UpstreamHandler {
    func handle(batch messages: [UpstreamMessage], in context: BatchContext) async throws
}

/// A table in which a handler writes one row per message, keyed by its `message_id`.
public struct DeduplicationRecord: Sendable, Equatable {
    public let table: String
    public let keyColumn: String

    public init(table: String, keyColumn: String) {
        self.table = table
        self.keyColumn = keyColumn
    }
}

/// A batch handler whose rows are also the messages' de-duplication record: its batch
/// statement writes one row per message into `deduplicationRecord.table` with a plain
/// INSERT (the key column unique, so a batch meeting a message handled before fails with a
/// unique violation) in the message's transaction.
///
/// The worker then reads that table to tell redeliveries apart: a message whose id is
/// there counts as handled. When such handlers are the only ones, for every message, no
/// other record is written, and a batch commits in one round trip.
public protocol RecordsUpstreamMessages: BatchUpstreamHandler {
    var deduplicationRecord: DeduplicationRecord { get }
}
