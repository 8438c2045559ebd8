import Foundation

/// What a CCS connection read that concerns downstream messages: the answers to the
/// messages sent on it, and delivery receipts (for messages any worker sent).
package enum DownstreamAnswer: Sendable {
    case ack(messageID: String, canonicalToken: String?)
    case nack(messageID: String, code: String, description: String?)
    case stanzaError(stanzaID: String, condition: String, text: String?)
    /// A stanza error without a stanza id, whose echoed payload named the message.
    case stanzaErrorForMessage(messageID: String, condition: String, text: String?)
    /// A delivery receipt for the message sent as `originalMessageID`, read at `receivedAt`.
    case receipt(originalMessageID: String, receivedAt: Date)
}
