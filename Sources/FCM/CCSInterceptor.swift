import Foundation
import XMPP

/// Decodes CCS stanzas on the connection's thread and applies the ack policy there: in
/// immediate mode the ack of every upstream message is written at once; receipts, and
/// unusable messages that can be acked, are acked at once in both modes (durable mode
/// and journal mode ack an unusable message after its dead letter commits; journal mode
/// acks an upstream message once the worker's journal holds it). `CONNECTION_DRAINING` is
/// reported from here too, and closes the connection's send gate, so that sending stops
/// before anything read after it is answered. Answers to downstream messages (acks, nacks,
/// stanza errors, delivery receipts) go to `onAnswer` there too.
package struct CCSInterceptor: StanzaInterceptor {
    let ackMode: CCSAckMode
    /// Journal mode's journal.
    let journal: (any CCSJournal)?
    let route: CCSAckRoute
    /// Called on the connection's thread when CCS announces it is draining the connection.
    let onDraining: @Sendable () -> Void
    /// Called on the connection's thread with each ack, nack, stanza error and delivery
    /// receipt; true when it dealt with it (it is then not queued for the consumer; a
    /// receipt is queued whatever it says).
    let onAnswer: @Sendable (CCSInbound) -> Bool
    /// Called on the connection's thread after the stanzas of each read.
    let afterRead: @Sendable () -> Void

    /// Immediate mode on no connection (nothing journaled, no durable ack routed): the work
    /// a connection's thread does on each stanza, for the upstream benchmark's floor phase.
    package static func immediateWithoutConnection() -> CCSInterceptor {
        CCSInterceptor(ackMode: .immediate, journal: nil, route: CCSAckRoute(label: "floor"), onDraining: {},
                       onAnswer: { _ in false }, afterRead: {})
    }

    /// An answer that `onAnswer` took is not queued.
    private func answer(_ inbound: CCSInbound) -> Interception<CCSInbound> {
        Interception(inbound: onAnswer(inbound) ? nil : inbound)
    }

    package func intercept(_ stanza: XMLElement) -> Interception<CCSInbound> {
        let receivedAt = Date()
        guard stanza.name == "message" else { return Interception(inbound: .ignored(stanza)) }
        if stanza.attribute("type") == "error" {
            let error = stanza.child("error")
            let condition = error?.elements.first { $0.name != "text" }?.name ?? "undefined-condition"
            // Without an id, the echoed payload (RFC 6120 §8.3.1) still names the message.
            let echoed = stanza.attribute("id") == nil ? CCSStanza.payload(of: stanza).flatMap(CCSMessage.identity(of:))?.messageID : nil
            return answer(.stanzaError(stanzaID: stanza.attribute("id"), messageID: echoed, condition: condition,
                                       text: error?.child("text")?.text))
        }
        guard let payload = CCSStanza.payload(of: stanza) else { return Interception(inbound: .ignored(stanza)) }
        let message: CCSMessage
        do {
            message = try CCSMessage.decode(json: payload)
        } catch {
            return unusable(payload, reason: error.isUnknownType ? .unknownType : .unreadable, detail: error.description,
                            members: error.isUnknownType ? CCSMessage.identity(of: payload) : nil, at: receivedAt)
        }
        switch message {
        case .upstream(let upstream):
            guard let messageID = upstream.messageID, let from = upstream.from else {
                let missing = upstream.messageID == nil ? "message_id" : "from"
                return Interception(inbound: .unusable(CCSUnusableMessage(
                    payload: payload, reason: .unackable, detail: "missing \(missing)", messageID: upstream.messageID,
                    from: upstream.from, category: upstream.category, receivedAt: receivedAt, ack: .impossible)))
            }
            // One object from here to the handlers.
            let received = CCSUpstreamMessage(messageID: messageID, from: from, category: upstream.category,
                                              dataJSON: upstream.dataJSON, json: upstream.json, connection: route.label,
                                              receivedAt: receivedAt)
            let arrival = { (ack: CCSAck) in CCSInbound.upstream(CCSUpstreamArrival(message: received, ack: ack)) }
            let stanza = CCSStanza.ack(to: from, messageID: messageID)
            switch ackMode {
            case .immediate: return Interception(reply: stanza, inbound: arrival(.sent))
            case .journal:
                let ack = DurableAck(messageID: messageID, stanza: stanza, route: route)
                guard let journal else { return Interception(inbound: arrival(.afterCommit(ack))) }
                let segment = journal.append(payload: payload, connection: route.label, receivedAt: receivedAt, ack: ack)
                return Interception(inbound: arrival(.afterJournal(segment: segment)))
            case .durable: return Interception(inbound: arrival(.afterCommit(DurableAck(messageID: messageID, stanza: stanza, route: route))))
            }
        case .receipt(let receipt):
            var reply: String?
            if let id = receipt.messageID, let from = receipt.from { reply = CCSStanza.ack(to: from, messageID: id) }
            // To the sender as an answer, and queued whatever `onAnswer` says: the consumer
            // reports it too.
            let inbound = CCSInbound.receipt(receipt, receivedAt: receivedAt)
            _ = onAnswer(inbound)
            return Interception(reply: reply, inbound: inbound)
        case .ack(let messageID, _, let canonical):
            return answer(.ack(messageID: messageID, canonicalToken: canonical))
        case .nack(let messageID, _, let code, let description, _):
            return answer(.nack(messageID: messageID, code: code, description: description))
        case .control(let type):
            guard type == "CONNECTION_DRAINING" else { return Interception(inbound: .control(type: type)) }
            onDraining()
            return Interception(inbound: .control(type: type), closesSendGate: true)
        }
    }

    /// A stanza over the size limit, read to its end without being kept: dead-lettered as
    /// `oversized` with its first bytes, and acked (as an unusable message is) when its
    /// `message_id` and `from` could be read, so that CCS neither redelivers it forever nor
    /// stops sending on the connection. The connection goes on.
    package func interceptOversized(_ stanza: OversizedStanza) -> Interception<CCSInbound> {
        let receivedAt = Date()
        guard stanza.name == "message", stanza.attribute("type") != "error" else {
            return Interception(inbound: .ignored(XMLElement(name: stanza.name, namespace: stanza.namespace,
                                                             attributeList: stanza.attributes, children: [])))
        }
        let members = stanza.members
        let identity = members["message_type"] == nil
            ? CCSMessage.Identity(messageID: members["message_id"], from: members["from"], category: members["category"]) : nil
        return unusable(stanza.textSample, reason: .oversized,
                        detail: "a stanza of \(stanza.byteCount) bytes, over the size limit: kept as its first "
                            + "\(stanza.textSample.utf8.count) bytes of text"
                            + (identity?.messageID == nil ? " (its message_id could not be read: not acked)" : ""),
                        members: identity, at: receivedAt)
    }

    /// Journal mode: the messages of the read just parsed go to disk together (and then
    /// their acks out).
    package func didInterceptRead() {
        journal?.writeAppended()
        afterRead()
    }

    /// An upstream message acked at once (every one in immediate mode) goes into the
    /// connection's inbox as itself, its one object, instead of in a box of its own.
    package func box(_ inbound: CCSInbound) -> any AnyObject & Sendable {
        if case .upstream(let arrival) = inbound, case .sent = arrival.ack { return arrival.message }
        return InboundBox(inbound)
    }

    /// What `box` made of an inbound, opened: a message (acked at once) or a box.
    package static func unbox(_ item: any AnyObject & Sendable) -> CCSInbound {
        if let message = item as? CCSUpstreamMessage { return .upstream(CCSUpstreamArrival(message: message, ack: .sent)) }
        return InboundBox<CCSInbound>.open(item)
    }

    /// An unusable message, acked now or after its dead letter commits when it names
    /// itself (`message_id` and `from`).
    private func unusable(_ payload: String, reason: CCSUnusableMessage.Reason, detail: String,
                          members: CCSMessage.Identity?, at receivedAt: Date) -> Interception<CCSInbound> {
        var ack = CCSAck.impossible
        var reply: String?
        if let members, let messageID = members.messageID, let from = members.from {
            let stanza = CCSStanza.ack(to: from, messageID: messageID)
            switch ackMode {
            case .immediate:
                reply = stanza
                ack = .sent
            case .journal, .durable:
                // Rare, and kept in the database rather than the journal: acked once kept.
                ack = .afterCommit(DurableAck(messageID: messageID, stanza: stanza, route: route))
            }
        }
        return Interception(reply: reply, inbound: .unusable(CCSUnusableMessage(
            payload: payload, reason: reason, detail: detail, messageID: members?.messageID, from: members?.from,
            category: members?.category, receivedAt: receivedAt, ack: ack)))
    }
}

private extension CCSMessage.DecodingError {
    var isUnknownType: Bool { if case .unknownMessageType = self { true } else { false } }
}
