import Foundation
import Runtime
import Synchronization
import XMPP

/// Where acks that waited for a commit or a journal write go: a CCS connection
/// (`CCSAckRoute`), or the HTTPS answer a device waits for.
public protocol UpstreamAckRoute: AnyObject, Sendable {
    /// Names the route in logs (`ccs#1.1`, `https`).
    var label: String { get }
    /// Writes `acks` (all of this route), waiting for room if the route has a bound.
    func write(_ acks: [DurableAck]) async throws
    /// Writes `acks` at once, never waiting (the journal's thread).
    func writeWithoutWaiting(_ acks: [DurableAck]) throws
}

/// The ack of an upstream message that waits for the message's commit (durable mode) or
/// its journal write (journal mode),
/// bound to the connection the message came in on, as CCS requires. A class: the work
/// that carries it is copied along the pipeline, and a reference is cheap to copy.
public final class DurableAck: Sendable {
    public let messageID: String
    /// The ack's stanza (CCS), or empty.
    public let stanza: String
    public let route: any UpstreamAckRoute
    /// Set before the ack is written when the commit found the message handled before: an
    /// HTTPS answer says `duplicate`. Only routes that ask (`tracksDuplicates`) are told.
    private let duplicate = Atomic(false)
    /// Whether the pipeline marks duplicates on it (CCS's acks do not say).
    public let tracksDuplicates: Bool

    public init(messageID: String, stanza: String, route: any UpstreamAckRoute, tracksDuplicates: Bool = false) {
        self.messageID = messageID
        self.stanza = stanza
        self.route = route
        self.tracksDuplicates = tracksDuplicates
    }

    /// True once the commit found the message handled before.
    public var wasDuplicate: Bool { duplicate.load(ordering: .acquiring) }

    /// The commit found the message handled before.
    public func markDuplicate() { duplicate.store(true, ordering: .releasing) }

    /// Writes `acks` after their commit: one write per connection, however many acks.
    /// Returns, per connection label, the ids whose ack could not be written (the
    /// connection is gone: CCS redelivers those messages, and de-duplication recognises
    /// them) with the reason.
    public static func send(_ acks: [DurableAck]) async -> [(connection: String, messageIDs: [String], error: (any Error)?)] {
        var outcomes: [(connection: String, messageIDs: [String], error: (any Error)?)] = []
        for (route, group) in grouped(acks) {
            do {
                try await route.write(group)
                outcomes.append((route.label, group.map(\.messageID), nil))
            } catch {
                outcomes.append((route.label, group.map(\.messageID), error))
            }
        }
        return outcomes
    }

    /// Like `send`, without waiting: the acks are queued on their connections at once,
    /// past the outbound buffers' bound (CCS bounds them: 100 unacked per connection). For
    /// the journal's thread, which must not wait on the cooperative pool.
    public static func sendWithoutWaiting(_ acks: [DurableAck]) -> [(connection: String, messageIDs: [String], error: (any Error)?)] {
        grouped(acks).map { route, group in
            do {
                try route.writeWithoutWaiting(group)
                return (route.label, group.map(\.messageID), nil)
            } catch {
                return (route.label, group.map(\.messageID), error)
            }
        }
    }

    /// `acks` by connection, in the order their connections first appear.
    private static func grouped(_ acks: [DurableAck]) -> [(any UpstreamAckRoute, [DurableAck])] {
        var byRoute: [ObjectIdentifier: [DurableAck]] = [:]
        var order: [any UpstreamAckRoute] = []
        for ack in acks {
            let key = ObjectIdentifier(ack.route)
            if byRoute[key] == nil { order.append(ack.route) }
            byRoute[key, default: []].append(ack)
        }
        return order.map { ($0, byRoute[ObjectIdentifier($0)] ?? []) }
    }
}

/// The connection durable acks go back on, known once it is established. Journal mode can
/// flush a message before `connect` has returned the connection: acks written that early
/// wait here and go out at `bind`.
///
/// It holds the connection weakly: the connection's own thread holds this route (through
/// its interceptor), so a strong reference would keep every ended connection, its buffers
/// and its wake pipe alive for good (the soak found two descriptors more after every
/// dropped or drained connection). An ack for a connection that is gone fails like one for
/// a closed connection: CCS redelivers the message.
final class CCSAckRoute: UpstreamAckRoute {
    private struct WeakConnection {
        weak var connection: XMPPConnection<CCSInbound>?
    }

    private enum State {
        case unbound(early: String)
        case bound(WeakConnection)
    }

    let label: String
    private let state = BlockingLock(State.unbound(early: ""))

    init(label: String) { self.label = label }

    func bind(_ established: XMPPConnection<CCSInbound>) {
        let early = state.withLock { state -> String in
            guard case .unbound(let early) = state else { return "" }
            state = .bound(WeakConnection(connection: established))
            return early
        }
        if !early.isEmpty { try? established.sendWithoutWaiting(serialized: early) }
    }

    private var connection: XMPPConnection<CCSInbound>? {
        state.withLock { if case .bound(let bound) = $0 { bound.connection } else { nil } }
    }

    func write(_ acks: [DurableAck]) async throws {
        guard let connection else { throw XMPPError.closedLocally }
        try await connection.send(serialized: Self.text(of: acks))
    }

    func writeWithoutWaiting(_ acks: [DurableAck]) throws {
        let text = Self.text(of: acks)
        // nil: kept for `bind`; .some(nil): the connection is gone.
        let target = state.withLock { state -> XMPPConnection<CCSInbound>?? in
            switch state {
            case .bound(let bound): return .some(bound.connection)
            case .unbound(let early):
                state = .unbound(early: early + text)
                return nil
            }
        }
        guard let target else { return }
        guard let connection = target else { throw XMPPError.closedLocally }
        try connection.sendWithoutWaiting(serialized: text)
    }

    private static func text(of acks: [DurableAck]) -> String {
        var text = ""
        text.reserveCapacity(acks.reduce(0) { $0 + $1.stanza.utf8.count })
        for ack in acks { text += ack.stanza }
        return text
    }
}
