import FCM
import XMPP

/// The connection that durable-mode acks go back on once their messages are committed.
///
/// CCS expects an ack on the connection the message came in on. The pipeline commits a
/// batch and then hands each route its acks at once, so a batch costs one write (and one
/// wakeup of the connection's thread) per connection rather than one per message.
final class AckRoute: Sendable {
    /// One ack waiting for its message's commit (a class: the work that carries it is
    /// copied along the pipeline, and this way a copy costs one reference count).
    final class Pending: Sendable {
        let route: AckRoute
        let messageID: String
        let stanza: String
        let message: CCSMessage

        init(route: AckRoute, messageID: String, stanza: String, message: CCSMessage) {
            self.route = route
            self.messageID = messageID
            self.stanza = stanza
            self.message = message
        }
    }

    private let connection: XMPPConnection
    private let onSent: @Sendable (_ messageID: String, _ message: CCSMessage) -> Void
    private let onFailure: @Sendable (_ messageIDs: [String], _ error: any Error) -> Void

    init(connection: XMPPConnection,
         onSent: @escaping @Sendable (String, CCSMessage) -> Void,
         onFailure: @escaping @Sendable ([String], any Error) -> Void) {
        self.connection = connection
        self.onSent = onSent
        self.onFailure = onFailure
    }

    /// An ack for `messageID` to `from`, to be sent on this route after the commit.
    func pending(messageID: String, from: String, message: CCSMessage) -> Pending {
        Pending(route: self, messageID: messageID, stanza: CCSStanza.ack(to: from, messageID: messageID), message: message)
    }

    /// Writes `acks` (all of this route) as one chunk. If the connection is gone they are
    /// not sent and CCS redelivers those messages, which de-duplication then recognises.
    func send(_ acks: [Pending]) async {
        guard !acks.isEmpty else { return }
        var text = ""
        text.reserveCapacity(acks.reduce(0) { $0 + $1.stanza.utf8.count })
        for ack in acks { text += ack.stanza }
        do {
            try await connection.send(serialized: text)
            for ack in acks { onSent(ack.messageID, ack.message) }
        } catch {
            onFailure(acks.map(\.messageID), error)
        }
    }
}
