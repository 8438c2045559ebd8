import Foundation

/// Where journal mode puts an upstream message before its ack: the worker's journal,
/// which flushes it to disk and then sends `ack`. Called on the connection's thread as the
/// stanza is parsed, so it must not block (queue the message and return).
public protocol CCSJournal: Sendable {
    /// Queues a message; returns the journal segment it goes to, which the caller releases
    /// once the message has committed.
    func append(payload: String, connection: String, receivedAt: Date, ack: DurableAck) -> Int
}
