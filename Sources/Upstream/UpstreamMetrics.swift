import Foundation

/// What the upstream pipeline and its sources count, for the worker's metrics
/// (`WorkerMetrics` is one): the pipeline depends on this, never on the worker.
package protocol UpstreamMetrics: Sendable {
    /// A read batch of a connection: `received` upstream messages (and dead letters),
    /// `acked` of them acked on arrival.
    func read(received: Int, acked: Int)
    /// `count` messages acked once journaled or committed.
    func durablyAcked(_ count: Int)
    /// A committed batch: its size, how long the commit took, the messages handled (with
    /// when they arrived), the duplicates skipped and the dead letters written by reason.
    func committed(batch size: Int, took seconds: Double, handled: [Date], duplicates: Int, deadLetters: [String], at now: Date)
    /// A batch is tried again after a handler's transient failure.
    func retried()
    /// The database refused a batch for its state (down, read-only, restarting).
    func databaseError()
    /// `count` acked messages went to the spool at shutdown.
    func spooled(_ count: Int)
    /// `count` acked messages could be kept neither in the database nor in the spool.
    func lost(_ count: Int)
    /// Handler `name` ran `runs` messages, failing or not.
    func handler(_ name: String, runs: Int, failed: Bool)
    /// A CCS connection connected or disconnected (other events are not counted).
    func connection(_ event: WorkerEvent)
    /// A CCS connection attempt failed.
    func connectFailed()
    /// CCS drained a connection.
    func drained()
    /// The journal wrote and flushed `records` messages in `seconds`.
    func journalFlushed(seconds: Double, records: Int)
    /// The journal cannot be written now, for `reason`: readiness says it until
    /// `journalRecovered`.
    func journalFailed(_ reason: String)
    /// The journal is written again (or its writer stopped).
    func journalRecovered()
}
