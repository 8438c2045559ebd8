import FCM
import Foundation
import Runtime
import Transport

/// One unit of upstream work in the pipeline: a message for the handlers, or a dead letter
/// to keep, with where its ack stands.
package struct UpstreamWork: Sendable {
    /// Something that cannot reach a handler but must be kept.
    package struct DeadLetter: Sendable {
        var messageID: String?
        var from: String?
        var category: String?
        var rawPayload: String
        /// `unackable`, `unreadable`, `unknown_type`, `handler_failed`, `unrouted` or
        /// `oversized` (the `dead_letters.reason` values).
        var reason: String
        var error: String?
        var attempts: Int
        var receivedAt: Date
        /// The handler that refused it or failed it last (`dead_letters.handler`).
        var handler: String? = nil
        /// The reason code of its refusal (`dead_letters.code`): a `PermanentFailure`'s code.
        var code: String? = nil

        package init(messageID: String? = nil, from: String? = nil, category: String? = nil, rawPayload: String, reason: String,
                     error: String? = nil, attempts: Int, receivedAt: Date, handler: String? = nil, code: String? = nil) {
            self.messageID = messageID
            self.from = from
            self.category = category
            self.rawPayload = rawPayload
            self.reason = reason
            self.error = error
            self.attempts = attempts
            self.receivedAt = receivedAt
            self.handler = handler
            self.code = code
        }
    }

    /// Both cases hold one reference, so work is small and cheap to copy along the pipeline.
    package enum Kind: Sendable {
        case message(UpstreamMessage)
        indirect case deadLetter(DeadLetter)
    }

    package var kind: Kind
    /// Acked already, to be acked after the commit (durable mode) or once journaled
    /// (journal mode), or not ackable.
    var ack: CCSAck
    /// Failed handling attempts so far.
    var attempts = 0
    /// When a failed message may be tried again.
    var retryAt: ContinuousClock.Instant? {
        get { storedRetryAt?.instant }
        set { storedRetryAt = newValue.map(FixedLayoutInstant.init) }
    }

    /// `retryAt`, in a type whose layout is known when this is compiled: with a
    /// `ContinuousClock.Instant` here, every copy of every piece of work along the pipeline
    /// would go through value witnesses looked up at run time.
    private var storedRetryAt: FixedLayoutInstant?

    package init(kind: Kind, ack: CCSAck) {
        self.kind = kind
        self.ack = ack
    }

    /// An upstream message as it arrived (its connection named in it).
    init(_ arrival: CCSUpstreamArrival) {
        self.init(kind: .message(UpstreamMessage(arrival.message)), ack: arrival.ack)
    }

    /// A message that cannot be handled, as a dead letter (its id in the form PostgreSQL
    /// can keep, `storableMessageID`).
    init(_ unusable: CCSUnusableMessage) {
        self.init(kind: .deadLetter(DeadLetter(messageID: unusable.messageID.map(Self.storableMessageID),
                                               from: unusable.from.flatMap(Self.storableText),
                                               category: unusable.category.flatMap(Self.storableText),
                                               rawPayload: unusable.payload, reason: unusable.reason.rawValue,
                                               error: unusable.detail, attempts: 0, receivedAt: unusable.receivedAt)),
                  ack: unusable.ack)
    }

    /// The longest `message_id` or `from` token kept as it is, in bytes of UTF-8: each is
    /// a key of a PostgreSQL index (`processed_upstream`, `upstream_messages`), whose entries
    /// hold at most about 2,700 bytes. FCM's ids and tokens are far shorter.
    static let longestIndexedField = 1024

    /// Whether `text` can be kept as it is in an indexed column: not too long, no U+0000
    /// (PostgreSQL's text holds none, and libpq would cut it there).
    static func isStorableKey(_ text: String) -> Bool {
        text.utf8.count <= longestIndexedField && !text.holdsNUL
    }

    /// `text` if PostgreSQL's text can hold it (no U+0000), else nil.
    static func storableText(_ text: String) -> String? {
        text.holdsNUL ? nil : text
    }

    /// A message id as the de-duplication record and a dead letter can keep it: itself, or,
    /// when it is too long or holds U+0000, `sha256:` and the digest of its UTF-8 (the same
    /// for every redelivery, so that one is recognised and kept once).
    static func storableMessageID(_ id: String) -> String {
        isStorableKey(id) ? id : "sha256:" + SHA256.hex(Array(id.utf8))
    }

    /// The key that keeps one device's messages in order: its registration token, or, for a
    /// message that came over HTTPS, its verified sender (the prefix of its id: see
    /// `IngressMessageID`).
    var orderingKey: String {
        switch kind {
        case .message(let message): IngressMessageID.senderPrefix(of: message.messageID) ?? message.from
        case .deadLetter(let letter): letter.from ?? ""
        }
    }

    var messageID: String? {
        switch kind {
        case .message(let message): message.messageID
        case .deadLetter(let letter): letter.messageID
        }
    }

    /// True when CCS got its ack already and only memory holds it: losing it now would lose
    /// it for good. (A journaled message is acked only once the journal holds it.)
    var isAcked: Bool { if case .sent = ack { true } else { false } }

    /// The journal segment holding it (journal mode), released once it commits.
    var journalSegment: Int? { if case .afterJournal(let segment) = ack { segment } else { nil } }

    /// The ack still to send after the commit (durable mode).
    var durableAck: DurableAck? { if case .afterCommit(let ack) = ack { ack } else { nil } }

    /// What the spool keeps of it.
    var spoolEntry: Spool.Entry {
        switch kind {
        case .message(let message):
            Spool.Entry(connection: message.connection, payload: message.rawPayload, receivedAt: message.receivedAt.timeIntervalSince1970)
        case .deadLetter(let letter):
            Spool.Entry(connection: "dead-letter", payload: letter.rawPayload, receivedAt: letter.receivedAt.timeIntervalSince1970)
        }
    }
}
