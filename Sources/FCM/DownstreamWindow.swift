import Runtime

/// The flow-control window of one CCS connection, as a pure state machine: at most
/// `capacity` downstream messages pending (sent, not yet acked or nacked). A slot is freed
/// only by the answer to that very message (an ack, a nack, or a stanza error carrying
/// the stanza id it was sent with). Upstream acks never count.
public struct DownstreamWindow: Sendable {
    /// CCS's limit per connection.
    public static let ccsCapacity = 100

    public struct Pending: Sendable, Equatable {
        public let messageID: String
        public let stanzaID: String
        public var sentAt: ContinuousClock.Instant { storedSentAt.instant }
        /// Order of sending on this connection.
        let sequence: UInt64
        /// `sentAt`, in a type whose layout is known when this is compiled: with a
        /// `ContinuousClock.Instant` here, every entry of the window's table would be copied,
        /// inserted and removed through value witnesses looked up at run time.
        let storedSentAt: FixedLayoutInstant
        /// The message itself, when the scheduler placed it (`send(_:stanzaID:at:)`): kept
        /// here rather than in a second table by id, so that an answer costs one lookup.
        let message: OutgoingDownstream?

        init(messageID: String, stanzaID: String, sentAt: ContinuousClock.Instant, sequence: UInt64,
             message: OutgoingDownstream? = nil) {
            self.messageID = messageID
            self.stanzaID = stanzaID
            self.sequence = sequence
            self.message = message
            storedSentAt = FixedLayoutInstant(sentAt)
        }
    }

    /// Why a message cannot be sent now.
    public enum SendRefusal: Error, Sendable, Equatable {
        /// The window is full: wait for an answer.
        case full
        /// A message with this id is already pending on this connection (ids must be unique).
        case duplicate(String)
    }

    public let capacity: Int
    private var pendingByMessage: [String: Pending] = [:]
    private var sent: UInt64 = 0

    public init(capacity: Int = DownstreamWindow.ccsCapacity) {
        self.capacity = capacity
    }

    public var count: Int { pendingByMessage.count }
    public var hasRoom: Bool { pendingByMessage.count < capacity }

    /// Records that a message goes out with `stanzaID` as its stanza id. The caller makes
    /// stanza ids unique on the connection (the scheduler numbers them): a stanza error is
    /// matched to the one message pending with its id.
    public mutating func send(messageID: String, stanzaID: String, at now: ContinuousClock.Instant) throws(SendRefusal) {
        try send(messageID: messageID, stanzaID: stanzaID, at: now, message: nil)
    }

    /// `send(messageID:stanzaID:at:)` of `message`, which its pending entry keeps.
    mutating func send(_ message: OutgoingDownstream, stanzaID: String, at now: ContinuousClock.Instant) throws(SendRefusal) {
        try send(messageID: message.messageID, stanzaID: stanzaID, at: now, message: message)
    }

    private mutating func send(messageID: String, stanzaID: String, at now: ContinuousClock.Instant,
                               message: OutgoingDownstream?) throws(SendRefusal) {
        guard hasRoom else { throw .full }
        let pending = Pending(messageID: messageID, stanzaID: stanzaID, sentAt: now, sequence: sent + 1, message: message)
        // One hash of the id for the check and the insert alike; a duplicate (rare) puts the
        // pending one back.
        if let earlier = pendingByMessage.updateValue(pending, forKey: messageID) {
            pendingByMessage[messageID] = earlier
            throw .duplicate(messageID)
        }
        sent += 1
    }

    /// An ack or nack for `messageID`: frees its slot. Nil if it was not pending here (an
    /// answer for another connection's message, or a second answer), which frees nothing.
    public mutating func answered(messageID: String) -> Pending? {
        pendingByMessage.removeValue(forKey: messageID)
    }

    /// A stanza error for the stanza sent with `stanzaID`: frees that message's slot. Found
    /// by a walk of the window (at most `capacity` entries): stanza errors are rare, and a
    /// map by stanza id cost every message an insert and a removal.
    public mutating func stanzaError(stanzaID: String) -> Pending? {
        guard let pending = pendingByMessage.values.first(where: { $0.stanzaID == stanzaID }) else { return nil }
        return answered(messageID: pending.messageID)
    }

    /// Frees the slots of messages sent before `cutoff` and never answered (an answer was
    /// lost, or a stanza error named no stanza), oldest first.
    public mutating func expire(sentBefore cutoff: ContinuousClock.Instant) -> [Pending] {
        let stale = pendingByMessage.values.filter { $0.sentAt < cutoff }.sorted { ($0.sentAt, $0.sequence) < ($1.sentAt, $1.sequence) }
        for pending in stale { pendingByMessage[pending.messageID] = nil }
        return stale
    }

    /// The connection is gone: everything pending must be sent again elsewhere. Empties
    /// the window and returns those messages, oldest first.
    public mutating func connectionLost() -> [Pending] {
        let all = pendingByMessage.values.sorted { ($0.sentAt, $0.sequence) < ($1.sentAt, $1.sequence) }
        pendingByMessage.removeAll()
        return all
    }
}
