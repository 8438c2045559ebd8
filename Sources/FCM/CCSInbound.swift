import Foundation
import XMPP

/// What a CCS connection received, typed and with its ack already decided (see
/// `CCSAckMode`): the stream a `CCSConnection` gives out, in arrival order.
public enum CCSInbound: Sendable {
    /// A device's upstream message with its `message_id` and `from`.
    case upstream(CCSUpstreamArrival)
    /// A delivery receipt (acked at once in both modes), for the original message
    /// `data.original_message_id`.
    case receipt(CCSMessage.Upstream, receivedAt: Date)
    /// CCS accepted a downstream message.
    case ack(messageID: String, canonicalToken: String?)
    /// CCS refused a downstream message with `code`.
    case nack(messageID: String, code: String, description: String?)
    /// A `<message type="error">`: the stanza `stanzaID` was refused. Without an id, the
    /// `message_id` of the payload CCS echoed back, if it did (nil for both: it names no
    /// message).
    case stanzaError(stanzaID: String?, messageID: String?, condition: String, text: String?)
    /// A control message (`CONNECTION_DRAINING`).
    case control(type: String)
    /// A message that cannot reach a handler but must be kept (dead-lettered).
    case unusable(CCSUnusableMessage)
    /// A stanza that is not CCS traffic (logged, otherwise ignored).
    case ignored(XMLElement)
}

/// An upstream message as it arrived, with where its ack stands: a reference to the
/// message and the ack, so that handing it on copies no field of the message.
public struct CCSUpstreamArrival: Sendable {
    public let message: CCSUpstreamMessage
    public let ack: CCSAck

    public init(message: CCSUpstreamMessage, ack: CCSAck) {
        self.message = message
        self.ack = ack
    }

    public var messageID: String { message.messageID }
    /// The sending device's registration token.
    public var from: String { message.from }
    /// When the connection's thread parsed it.
    public var receivedAt: Date { message.receivedAt }
}

/// Where an arrival's ack stands.
public enum CCSAck: Sendable {
    /// Written on the connection's thread as the stanza was parsed.
    case sent
    /// To be written once the message is committed (durable mode): `DurableAck.send`.
    case afterCommit(DurableAck)
    /// Queued in the worker's journal (journal mode), which sends the ack once the message
    /// is on disk; `segment` is released once the message has committed.
    case afterJournal(segment: Int)
    /// The message lacks `message_id` or `from`: it cannot be acked (CCS redelivers it).
    case impossible
}

/// A `<gcm>` payload that cannot be handled: not JSON, missing what is needed, or of an
/// unknown `message_type`. Acked when it has a `message_id` and a `from`, so that CCS does
/// not redeliver it forever.
public struct CCSUnusableMessage: Sendable {
    /// The `dead_letters.reason` values.
    public enum Reason: String, Sendable {
        /// Not JSON, not an object, or a known type lacking a required field.
        case unreadable
        /// An upstream message without `message_id` or `from`.
        case unackable
        /// A `message_type` CCS did not document.
        case unknownType = "unknown_type"
        /// A stanza over the size limit: read to its end, kept as its first bytes.
        case oversized
    }

    public let payload: String
    public let reason: Reason
    public let detail: String
    public let messageID: String?
    public let from: String?
    public let category: String?
    public let receivedAt: Date
    public let ack: CCSAck
}
