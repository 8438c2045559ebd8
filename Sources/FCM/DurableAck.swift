import Foundation
import Runtime
import XMPP

/// The ack of an upstream message that waits for the message's commit (durable mode),
/// bound to the connection the message came in on, as CCS requires. A class: the work
/// that carries it is copied along the pipeline, and a reference is cheap to copy.
public final class DurableAck: Sendable {
    public let messageID: String
    let stanza: String
    let route: CCSAckRoute

    init(messageID: String, stanza: String, route: CCSAckRoute) {
        self.messageID = messageID
        self.stanza = stanza
        self.route = route
    }

    /// Writes `acks` after their commit: one write per connection, however many acks.
    /// Returns, per connection label, the ids whose ack could not be written (the
    /// connection is gone: CCS redelivers those messages, and de-duplication recognises
    /// them) with the reason.
    public static func send(_ acks: [DurableAck]) async -> [(connection: String, messageIDs: [String], error: (any Error)?)] {
        var byRoute: [ObjectIdentifier: [DurableAck]] = [:]
        var order: [CCSAckRoute] = []
        for ack in acks {
            let key = ObjectIdentifier(ack.route)
            if byRoute[key] == nil { order.append(ack.route) }
            byRoute[key, default: []].append(ack)
        }
        var outcomes: [(connection: String, messageIDs: [String], error: (any Error)?)] = []
        for route in order {
            let group = byRoute[ObjectIdentifier(route)] ?? []
            do {
                try await route.write(group)
                outcomes.append((route.label, group.map(\.messageID), nil))
            } catch {
                outcomes.append((route.label, group.map(\.messageID), error))
            }
        }
        return outcomes
    }
}

/// The connection durable acks go back on, known once it is established.
final class CCSAckRoute: Sendable {
    let label: String
    private let connection = BlockingLock<XMPPConnection<CCSInbound>?>(nil)

    init(label: String) { self.label = label }

    func bind(_ established: XMPPConnection<CCSInbound>) {
        connection.withLock { $0 = established }
    }

    func write(_ acks: [DurableAck]) async throws {
        guard let connection = connection.withLock({ $0 }) else { throw XMPPError.closedLocally }
        var text = ""
        text.reserveCapacity(acks.reduce(0) { $0 + $1.stanza.utf8.count })
        for ack in acks { text += ack.stanza }
        try await connection.send(serialized: text)
    }
}
