import Foundation

/// Where a `CCSClient` takes its connections to be sent on and brings back what they read
/// about downstream messages (the outbox's XMPP transport is one): the one seam between the
/// connections and the sender. Every answer (ack, nack, stanza error, delivery receipt)
/// arrives through `received`, on the connection's thread, a read's worth at a time.
package protocol CCSLinks: Sendable {
    /// Starts sending on `connection`; returns its link id for the other calls.
    func attach(_ connection: CCSConnection) -> Int
    /// CCS is draining the link's connection: nothing more is sent on it.
    func drain(_ link: Int)
    /// The link's connection ended: what was pending on it goes out on another.
    func detach(_ link: Int)
    /// What one read of the link's connection said about downstream messages, in order.
    /// Called on the connection's thread: it must not wait.
    func received(_ answers: [DownstreamAnswer], on link: Int)
    /// How long an answer may be late before its message is presumed lost and sent again.
    var answerTimeout: Duration { get }
}
