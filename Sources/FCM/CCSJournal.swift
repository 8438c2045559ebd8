import Foundation

/// Where journal mode puts an upstream message before its ack: the worker's journal,
/// which flushes it to disk and then sends `ack`. `append` is called on the connection's
/// thread as the stanza is parsed, and `writeAppended` on the same thread once the whole
/// read is parsed.
public protocol CCSJournal: Sendable {
    /// Queues a message; returns the journal segment it goes to, which the caller releases
    /// once the message has committed. Must not block. What is queued is written once
    /// `writeAppended` is called: call it after the stanzas of a read are parsed.
    func append(payload: String, connection: String, receivedAt: Date, ack: DurableAck) -> Int

    /// Starts the write of what `append` queued (without waiting for it). Called once per
    /// read rather than once per message: a writer woken by the first message of a read
    /// would flush it alone, and the rest of the read would wait for that flush and then
    /// their own (measured in paired runs of `bench upstream --phases latency`: see
    /// docs/reliability.md, "One wake per read").
    func writeAppended()
}

extension CCSJournal {
    /// For a journal that starts its writes in `append`.
    public func writeAppended() {}
}
