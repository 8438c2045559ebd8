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
        public let sentAt: ContinuousClock.Instant
        /// Order of sending on this connection.
        let sequence: UInt64
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
    private var messageByStanza: [String: String] = [:]
    private var sent: UInt64 = 0

    public init(capacity: Int = DownstreamWindow.ccsCapacity) {
        self.capacity = capacity
    }

    public var count: Int { pendingByMessage.count }
    public var hasRoom: Bool { pendingByMessage.count < capacity }

    /// Records that a message goes out with `stanzaID` as its stanza id.
    public mutating func send(messageID: String, stanzaID: String, at now: ContinuousClock.Instant) throws(SendRefusal) {
        guard hasRoom else { throw .full }
        guard pendingByMessage[messageID] == nil, messageByStanza[stanzaID] == nil else { throw .duplicate(messageID) }
        sent += 1
        pendingByMessage[messageID] = Pending(messageID: messageID, stanzaID: stanzaID, sentAt: now, sequence: sent)
        messageByStanza[stanzaID] = messageID
    }

    /// An ack or nack for `messageID`: frees its slot. Nil if it was not pending here (an
    /// answer for another connection's message, or a second answer), which frees nothing.
    public mutating func answered(messageID: String) -> Pending? {
        guard let pending = pendingByMessage.removeValue(forKey: messageID) else { return nil }
        messageByStanza[pending.stanzaID] = nil
        return pending
    }

    /// A stanza error for the stanza sent with `stanzaID`: frees that message's slot.
    public mutating func stanzaError(stanzaID: String) -> Pending? {
        guard let messageID = messageByStanza[stanzaID] else { return nil }
        return answered(messageID: messageID)
    }

    /// Frees the slots of messages sent before `cutoff` and never answered (an answer was
    /// lost, or a stanza error named no stanza), oldest first.
    public mutating func expire(sentBefore cutoff: ContinuousClock.Instant) -> [Pending] {
        let stale = pendingByMessage.values.filter { $0.sentAt < cutoff }.sorted { ($0.sentAt, $0.sequence) < ($1.sentAt, $1.sequence) }
        for pending in stale {
            pendingByMessage[pending.messageID] = nil
            messageByStanza[pending.stanzaID] = nil
        }
        return stale
    }

    /// The connection is gone: everything pending must be sent again elsewhere. Empties
    /// the window and returns those messages, oldest first.
    public mutating func connectionLost() -> [Pending] {
        let all = pendingByMessage.values.sorted { ($0.sentAt, $0.sequence) < ($1.sentAt, $1.sequence) }
        pendingByMessage.removeAll()
        messageByStanza.removeAll()
        return all
    }
}
