import FCM
import Foundation
import Postgres
import Runtime
import XMPP

/// What a connection's reader saw that concerns downstream messages.
package enum DownstreamAnswer: Sendable {
    case ack(messageID: String, canonicalToken: String?)
    case nack(messageID: String, code: String, description: String?)
    case stanzaError(stanzaID: String, condition: String, text: String?)
    /// A stanza error without a stanza id, whose echoed payload named the message.
    case stanzaErrorForMessage(messageID: String, condition: String, text: String?)
}
