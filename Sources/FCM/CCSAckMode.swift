/// When a CCS connection acks upstream messages.
///
/// | mode        | ack sent                           | survives a process crash | a machine crash / disk loss |
/// |-------------|------------------------------------|--------------------------|-----------------------------|
/// | `immediate` | on arrival                         | no (uncommitted lost)    | no                          |
/// | `journal`   | after a group-committed `fdatasync`| yes                      | machine crash yes, disk no  |
/// | `durable`   | after the database commit          | yes                      | yes (the database's)        |
public enum CCSAckMode: String, Sendable, CaseIterable {
    /// As soon as the stanza is parsed, on the connection's own thread, before any
    /// database work (lowest latency; what is acked but not yet committed at shutdown goes
    /// to the spool; a `kill -9` loses what was acked but not committed).
    case immediate
    /// After the message is appended to a local journal and flushed to disk (one
    /// `fdatasync` for everything that arrived meanwhile): a sub-millisecond ack that a
    /// `kill -9` or a power cut does not undo; the next start replays the journal. Messages
    /// that cannot be handled are acked after their dead letter commits, as in `durable`.
    case journal
    /// Only after the message is committed (nothing acked is lost even on kill -9; CCS
    /// redelivers what was not acked).
    case durable
}
