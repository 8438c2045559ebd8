import FCM
import Foundation
import Postgres
import Runtime
import XMPP

/// What the worker's CCS connections tell the XMPP transport (and, through `attach`, give
/// it to send on): the seam between the connections and the outbox.
package protocol CCSLinks: Sendable {
    /// Starts sending on `connection`; returns its link id for the other calls.
    func attach(_ connection: CCSConnection) -> Int
    /// CCS is draining the link's connection: nothing more is sent on it.
    func drain(_ link: Int)
    /// The link's connection ended: what was pending on it goes out on another.
    func detach(_ link: Int)
    /// Answers read on the link's connection, in their order.
    func received(_ answers: [DownstreamAnswer], on link: Int)
    /// A delivery receipt for the message sent as `originalMessageID` (by any worker).
    func receipt(originalMessageID: String, at date: Date)
    /// How long an answer may be late before its message is presumed lost and sent again.
    var answerTimeout: Duration { get }
}
