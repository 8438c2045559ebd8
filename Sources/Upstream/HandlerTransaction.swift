import Postgres

/// Where a handler context's effects go. In the worker, the batch's database transaction
/// (statements pipelined, outbox rows, actions run after COMMIT); in a handler's unit
/// tests, a recording (`WorkerTesting`'s `RecordingTransaction`).
///
/// One transaction serves one batch, on one task at a time.
public protocol HandlerTransaction: AnyObject {
    /// Queues a statement: it runs before the next `query` or at commit.
    func enqueue(_ statement: PostgresStatement)
    /// Runs the queued statements, then `statement`, and returns its result.
    func run(_ statement: PostgresStatement) async throws -> PostgresResult
    /// Queues a downstream message (an outbox row written in the transaction).
    func send(_ message: OutgoingMessage)
    /// Keeps `action` to run once the transaction has committed.
    func afterCommit(_ action: @escaping @Sendable () async -> Void)
}
