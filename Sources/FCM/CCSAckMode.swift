/// When a CCS connection acks upstream messages.
public enum CCSAckMode: String, Sendable, CaseIterable {
    /// As soon as the stanza is parsed, on the connection's own thread, before any
    /// database work (lowest latency; what is acked but not yet committed at shutdown goes
    /// to the spool).
    case immediate
    /// Only after the message is committed (nothing acked is lost even on kill -9; CCS
    /// redelivers what was not acked).
    case durable
}
