import Foundation

/// One unit of upstream work in the pipeline.
struct UpstreamWork: Sendable {
    /// Something that cannot reach a handler but must be kept.
    struct DeadLetter: Sendable {
        var messageID: String?
        var from: String?
        var category: String?
        var rawPayload: String
        /// `unackable`, `unreadable` or `handler_failed` (the `dead_letters.reason` values).
        var reason: String
        var error: String?
        var attempts: Int
        var receivedAt: Date
    }

    /// Both cases hold one reference, so work is small and cheap to copy along the pipeline.
    enum Kind: Sendable {
        case message(UpstreamMessage)
        indirect case deadLetter(DeadLetter)
    }

    var kind: Kind
    /// In durable mode, sends the ack once the work is committed; nil when it was acked on
    /// arrival (or cannot be acked).
    var ack: AckRoute.Pending?
    /// Failed handling attempts so far.
    var attempts = 0
    /// When a failed message may be tried again.
    var retryAt: ContinuousClock.Instant?

    /// The key that keeps one device's messages in order (its registration token).
    var orderingKey: String {
        switch kind {
        case .message(let message): message.from
        case .deadLetter(let letter): letter.from ?? ""
        }
    }

    var messageID: String? {
        switch kind {
        case .message(let message): message.messageID
        case .deadLetter(let letter): letter.messageID
        }
    }

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
