import Foundation
import Runtime
import XMPP

/// A downstream message claimed from the outbox and ready to be placed on a connection.
public struct OutgoingDownstream: Sendable, Equatable {
    /// The outbox row.
    public let rowID: Int64
    /// The `message_id` on the wire; FCM's answer carries it back.
    public let messageID: String
    /// The token, topic or condition it goes to: what a rate limit slows down.
    public let target: String
    /// True when `target` is a registration token or notification key (not a topic or a
    /// condition): only then can FCM report it bad or replace it.
    public let targetIsToken: Bool
    /// The `<gcm>` JSON.
    public let json: String
    /// When the row was inserted (its age bounds retries and its time to live).
    public let createdAt: Date
    /// Seconds; nil for FCM's default of 4 weeks.
    public let timeToLive: Int?
    /// Which attempt the next send is (1 for the first).
    public var attempt: Int

    public init(rowID: Int64, messageID: String, target: String, targetIsToken: Bool, json: String, createdAt: Date,
                timeToLive: Int?, attempt: Int) {
        self.rowID = rowID
        self.messageID = messageID
        self.target = target
        self.targetIsToken = targetIsToken
        self.json = json
        self.createdAt = createdAt
        self.timeToLive = timeToLive
        self.attempt = attempt
    }
}

/// Places downstream messages on CCS connections, as a pure state machine.
///
/// Each open connection ("link") has its own `DownstreamWindow` of 100; `take(for:)` fills a
/// link's free slots from one shared queue, so sends spread over the links that have
/// room. A draining link takes nothing more but keeps its pending messages until they
/// are answered or the link closes; closing a link puts what was pending on it back at
/// the front of the queue (at-least-once: never zero times). Targets that hit a rate
/// limit are slowed down: their messages are handed back as deferred instead of placed.
public struct DownstreamScheduler: Sendable {
    /// A message placed on a link, with the stanza id it must be sent with.
    public struct Placement: Sendable, Equatable {
        public let message: OutgoingDownstream
        public let stanzaID: String
    }

    /// A message whose answer came: its slot is free again.
    ///
    /// A struct rather than a tuple: a labelled tuple's copies went through value witnesses
    /// looked up at run time (tuple metadata is made then), about 1 % of the worker's CPU per
    /// downstream message. For the same reason it keeps its instant as a
    /// `FixedLayoutInstant`.
    public struct Answered: Sendable, Equatable {
        public let message: OutgoingDownstream
        /// When it was written.
        public var sentAt: ContinuousClock.Instant { storedSentAt.instant }
        private let storedSentAt: FixedLayoutInstant

        /// The message `pending` holds, taken out of it (nil for an entry placed without one).
        init?(_ pending: consuming DownstreamWindow.Pending) {
            guard let message = pending.message else { return nil }
            self.message = message
            storedSentAt = pending.storedSentAt
        }
    }

    /// A message not placed because its target is slowed down until `until`.
    public struct Deferral: Sendable, Equatable {
        public let message: OutgoingDownstream
        public let until: ContinuousClock.Instant
    }

    /// A link's window holds its pending messages themselves (`DownstreamWindow.Pending.message`).
    private struct Link {
        var window: DownstreamWindow
        var draining = false
    }

    private var links: [Int: Link] = [:]
    private var ready = FIFO<OutgoingDownstream>()
    private var slowDowns = SlowDowns()
    private var stanzaSequence = 0

    public init() {}

    /// Messages waiting for a slot.
    public var readyCount: Int { ready.count }
    /// Messages sent and not yet answered, over all links.
    public var pendingCount: Int { links.values.reduce(0) { $0 + $1.window.count } }
    /// Free slots in `link`'s window (0 when it is draining or closed).
    public func freeSlots(on link: Int) -> Int {
        guard let state = links[link], !state.draining else { return 0 }
        return state.window.capacity - state.window.count
    }
    /// Messages pending on `link`.
    public func pendingCount(on link: Int) -> Int { links[link]?.window.count ?? 0 }
    /// Every open link with its pending count and whether it drains.
    public var linkStates: [(link: Int, pending: Int, draining: Bool)] {
        links.map { (link: $0.key, pending: $0.value.window.count, draining: $0.value.draining) }.sorted { $0.link < $1.link }
    }

    /// Links that accept new messages (open and not draining).
    public var sendingLinks: Int { links.values.count { !$0.draining } }
    /// Free slots over the links that accept new messages.
    public var freeSlots: Int {
        links.values.reduce(0) { $0 + ($1.draining ? 0 : $1.window.capacity - $1.window.count) }
    }
    /// True when `link` is open, not draining, with a free slot and a message waiting.
    public func canTake(for link: Int) -> Bool {
        guard let state = links[link], !state.draining else { return false }
        return state.window.hasRoom && !ready.isEmpty
    }
    /// True when `link` is open and not draining.
    public func accepts(_ link: Int) -> Bool { links[link].map { !$0.draining } ?? false }

    /// A new connection with a window of `capacity`.
    public mutating func open(_ link: Int, capacity: Int = DownstreamWindow.ccsCapacity) {
        links[link] = Link(window: DownstreamWindow(capacity: capacity))
    }

    /// Queues messages behind those already waiting.
    public mutating func enqueue<S: Sequence>(_ messages: S) where S.Element == OutgoingDownstream {
        ready.append(contentsOf: messages)
    }

    /// Queues a message ahead of those waiting (it was already due).
    public mutating func enqueueFront(_ message: OutgoingDownstream) {
        ready.prepend(contentsOf: [message])
    }

    /// Fills `link`'s free slots from the queue, oldest first. Messages to a slowed-down
    /// target are returned as deferred and leave the queue.
    public mutating func take(for link: Int, now: ContinuousClock.Instant) -> (placed: [Placement], deferred: [Deferral]) {
        // Links are mutated in place through the dictionary (a copy would copy its windows).
        guard let state = links[link], !state.draining else { return ([], []) }
        var placed: [Placement] = []
        var deferred: [Deferral] = []
        placed.reserveCapacity(min(ready.count, state.window.capacity - state.window.count))
        while links[link]!.window.hasRoom, let message = ready.popFirst() {
            if let until = slowDowns.heldUntil(message.target, now: now) {
                deferred.append(Deferral(message: message, until: until))
                continue
            }
            stanzaSequence += 1
            let stanzaID = "s\(stanzaSequence)"
            do {
                try links[link]!.window.send(message, stanzaID: stanzaID, at: now)
            } catch {
                // The same message id is pending here already (claimed twice): send it once.
                continue
            }
            placed.append(Placement(message: message, stanzaID: stanzaID))
        }
        return (placed, deferred)
    }

    /// An ack or nack on `link` for `messageID`: frees its slot and returns the message
    /// with when it was sent. Nil for an answer to nothing pending on that link.
    public mutating func answered(link: Int, messageID: String) -> Answered? {
        guard links[link] != nil, let pending = links[link]!.window.answered(messageID: messageID) else { return nil }
        return Answered(pending)
    }

    /// A stanza error on `link` for the stanza sent as `stanzaID`: frees that slot.
    public mutating func stanzaError(link: Int, stanzaID: String) -> Answered? {
        guard links[link] != nil, let pending = links[link]!.window.stanzaError(stanzaID: stanzaID) else { return nil }
        return Answered(pending)
    }

    /// CCS is draining `link`: nothing more is placed on it; its pending messages stay
    /// until they are answered or the link closes.
    public mutating func drain(_ link: Int) {
        links[link]?.draining = true
    }

    /// Messages placed on `link` that were never written (its connection refused them: CCS
    /// announced draining after they were taken): their slots are freed and they go back to
    /// the front of the queue in their order, as they were (the same attempt). Returns how
    /// many were still placed there.
    @discardableResult
    public mutating func withdraw(_ placements: [Placement], from link: Int) -> Int {
        guard links[link] != nil else { return 0 }
        let withdrawn = placements.compactMap { placement -> OutgoingDownstream? in
            // By message id (a window holds each id once), not by a walk for the stanza id.
            links[link]!.window.answered(messageID: placement.message.messageID)?.message
        }
        ready.prepend(contentsOf: withdrawn)
        return withdrawn.count
    }

    /// `link` is gone: what was pending on it goes back to the front of the queue, oldest
    /// first, to be sent again as its next attempt. Returns how many messages that was.
    @discardableResult
    public mutating func close(_ link: Int) -> Int {
        guard var state = links.removeValue(forKey: link) else { return 0 }
        let orphans = state.window.connectionLost().compactMap { pending -> OutgoingDownstream? in
            guard var message = pending.message else { return nil }
            message.attempt += 1
            return message
        }
        ready.prepend(contentsOf: orphans)
        return orphans.count
    }

    /// Messages pending since before `cutoff` with no answer: their slots are freed and
    /// they are queued again at the front (at-least-once). Returns how many.
    public mutating func expireUnanswered(sentBefore cutoff: ContinuousClock.Instant) -> Int {
        var expired: [OutgoingDownstream] = []
        for link in links.keys {
            for pending in links[link]!.window.expire(sentBefore: cutoff) {
                guard var message = pending.message else { continue }
                message.attempt += 1
                expired.append(message)
            }
        }
        ready.prepend(contentsOf: expired)
        return expired.count
    }

    /// Holds back messages to `target` until `until` (a rate limit).
    public mutating func slowDown(target: String, until: ContinuousClock.Instant) {
        slowDowns.slowDown(target, until: until)
    }

    /// Empties the queue (messages never sent), for handing them back at shutdown.
    public mutating func removeAllReady() -> [OutgoingDownstream] {
        ready.popFirst(ready.count)
    }

    /// Empties every window (messages sent and never answered), for handing them back.
    public mutating func removeAllPending() -> [OutgoingDownstream] {
        var all: [OutgoingDownstream] = []
        for link in links.keys {
            all += links[link]!.window.connectionLost().compactMap(\.message)
        }
        return all
    }
}
