import Runtime
import FCM
import Foundation
import Synchronization
import Transport
import XMPP

/// What the scripting API asks a session to do.
enum SessionCommand: Sendable {
    case draining(closeAfter: Duration?)
    case drop
    case closeStream
    case streamError(condition: String, text: String?)
    case raw([UInt8], recordSize: Int)
    case mute
}

/// Commands posted from any thread to one session's thread.
final class SessionMailbox: Sendable {
    private let commands = BlockingLock<[SessionCommand]>([])
    func post(_ command: SessionCommand) { commands.withLock { $0.append(command) } }
    func take() -> [SessionCommand] { commands.withLock { commands in defer { commands.removeAll() }; return commands } }
}

/// One simulated CCS connection, run on its stream's thread: negotiation, upstream
/// delivery under flow control, ack matching, downstream answers, receipts, draining.
final class SimulatedSession: StreamDriver {
    private struct Scheduled {
        let due: ContinuousClock.Instant
        let stanza: String
        let event: SimulatorEvent?
        let freesSlotOf: String?
        /// A delivery receipt to queue once this ack has gone out: (receipt JSON, receipt id).
        let receipt: (json: String, id: String)?
    }

    let id: Int
    private let simulator: CCSSimulator
    private let mailbox: SessionMailbox
    private var negotiation: CCSServerNegotiation
    private let reader: XMLStreamReader
    private var bound = false
    private var muted = false
    private var draining = false
    /// True once the client answered the ping sent right after `CONNECTION_DRAINING`: it
    /// has read the control message, so a downstream message from now on breaks the rule.
    private var drainingRead = false
    private var drainingSentAt: ContinuousClock.Instant?
    private var drainingPingID: String { "drain-check-\(id)" }
    private var closeAt: ContinuousClock.Instant?
    private var pendingDownstream: Set<String> = []
    private var unackedUpstream: Set<String> = []
    private var scheduled: [Scheduled] = []
    private var nextKeepalive: ContinuousClock.Instant?
    private var sentPreamble = false
    private var pendingAcks: [(messageID: String, to: String?)] = []
    private var config: SimulatorConfiguration { simulator.configuration }

    init(id: Int, simulator: CCSSimulator, mailbox: SessionMailbox) {
        self.id = id
        self.simulator = simulator
        self.mailbox = mailbox
        self.negotiation = CCSServerNegotiation(senderID: simulator.configuration.senderID,
                                                serverKey: simulator.configuration.serverKey,
                                                domain: simulator.configuration.domain)
        self.reader = XMLStreamReader(maxStanzaBytes: simulator.configuration.maxStanzaBytes, maxDepth: XMLStreamParser.defaultMaxDepth)
    }

    func streamDidOpen(_ loop: StreamLoop) {}

    var wantsToRead: Bool { !muted }

    func nextDeadline(_ loop: StreamLoop) -> ContinuousClock.Instant? {
        if muted { return closeAt }
        if !pendingAcks.isEmpty { return .now }
        return [scheduled.first?.due, nextKeepalive, closeAt].compactMap { $0 }.min()
    }

    func streamDidEnd(_ loop: StreamLoop, reason: any Error) {
        simulator.sessionEnded(id, reason: XMPPError(ending: reason).description)
    }

    func stream(_ loop: StreamLoop, didRead bytes: UnsafeRawBufferPointer) {
        reader.read(bytes, on: loop) { event in handle(event, loop) }
    }

    private func handle(_ event: XMLStreamEvent, _ loop: StreamLoop) {
        guard !muted else { return }
        for action in negotiation.handle(event) {
            switch action {
            case .send(let text):
                if let preamble = config.preamble, !sentPreamble {
                    sentPreamble = true
                    loop.write(preamble)
                }
                loop.write(text)
            case .restartStream: reader.restart()
            case .authenticated: break
            case .refused(let reason):
                simulator.record(.authenticationRefused(session: id, reason: reason))
                loop.close(reason: XMPPError.authenticationRefused(condition: "not-authorized"))
            case .bound(let jid):
                bound = true
                if let interval = config.whitespaceKeepaliveInterval { nextKeepalive = .now + interval }
                simulator.sessionBound(id, jid: jid)
                deliverUpstream(loop)
            case .stanza(let stanza): handle(stanza, loop)
            case .violation(let condition, let detail):
                simulator.record(.violation(session: id, .stream(detail)))
                loop.write("<stream:error><\(condition) xmlns=\"\(XMPPNamespace.streamErrors)\"/></stream:error>")
                loop.close(reason: XMPPError.protocolViolation(detail))
            case .clientClosed:
                loop.close(reason: XMPPError.closedByPeer)
            case .pingAnswered:
                simulator.record(.pingAnswered(session: id))
            }
        }
    }

    func streamDidWake(_ loop: StreamLoop) {
        settleAcks()
        for command in mailbox.take() {
            perform(command, loop)
            if loop.isEnded { return }
        }
        let now = ContinuousClock.now
        if let closeAt, now >= closeAt {
            loop.close(reason: XMPPError.closedLocally)
            return
        }
        guard !muted else { return }
        // Answers fall due in order; take them all at once (removing one at a time from the
        // front would move the whole array each time).
        let due = scheduled.firstIndex { $0.due > now } ?? scheduled.endIndex
        if due > 0 {
            for item in scheduled[..<due] {
                if let slot = item.freesSlotOf { pendingDownstream.remove(slot) }
                loop.write(item.stanza)
                if let event = item.event { simulator.record(event) }
                if let receipt = item.receipt { queueReceipt(receipt) }
            }
            scheduled.removeFirst(due)
        }
        if let keepalive = nextKeepalive, now >= keepalive, let interval = config.whitespaceKeepaliveInterval {
            loop.write(" ")
            nextKeepalive = now + interval
        }
        if bound { deliverUpstream(loop) }
    }

    private func perform(_ command: SessionCommand, _ loop: StreamLoop) {
        switch command {
        case .draining(let closeAfter):
            draining = true
            loop.write(CCSStanza.message(json: "{\"message_type\":\"control\",\"control_type\":\"CONNECTION_DRAINING\"}"))
            loop.write("<iq type=\"get\" id=\"\(drainingPingID)\" from=\"\(config.domain)\"><ping xmlns=\"\(XMPPNamespace.ping)\"/></iq>")
            drainingSentAt = .now
            simulator.record(.drainingSent(session: id))
            if let closeAfter { closeAt = .now + closeAfter }
        case .drop:
            loop.abort(reason: XMPPError.connectionLost("dropped by the simulator"))
        case .closeStream:
            loop.close(reason: XMPPError.closedLocally)
        case .streamError(let condition, let text):
            var error = "<stream:error><\(condition) xmlns=\"\(XMPPNamespace.streamErrors)\"/>"
            if let text { error += "<text xmlns=\"\(XMPPNamespace.streamErrors)\">\(XMLEscaping.escapeText(text))</text>" }
            loop.write(error + "</stream:error>")
            loop.close(reason: XMPPError.streamError(condition: condition, text: text))
        case .raw(let bytes, let recordSize):
            loop.write(bytes: bytes, recordSize: recordSize)
        case .mute:
            muted = true
        }
    }

    /// Matches the acks read since the last turn; their slots free up for `deliverUpstream`.
    private func settleAcks() {
        guard !pendingAcks.isEmpty else { return }
        let acks = pendingAcks
        pendingAcks.removeAll(keepingCapacity: true)
        for (ack, outcome) in zip(acks, simulator.acknowledge(acks, session: id)) {
            switch outcome {
            case .accepted(let latency):
                unackedUpstream.remove(ack.messageID)
                simulator.record(.upstreamAcked(session: id, messageID: ack.messageID, latency: latency))
            case .violation(let violation):
                simulator.record(.violation(session: id, violation))
            }
        }
    }

    /// Sends waiting upstream messages while fewer than the limit are unacked here.
    private func deliverUpstream(_ loop: StreamLoop) {
        guard !draining else { return }
        let records = simulator.takeUpstream(for: id, limit: config.maxUnackedUpstream - unackedUpstream.count)
        for record in records {
            if !record.messageID.isEmpty { unackedUpstream.insert(record.messageID) }
            loop.write(record.stanza)
            simulator.record(.upstreamDelivered(session: id, messageID: record.messageID))
        }
    }

    private func handle(_ stanza: XMLElement, _ loop: StreamLoop) {
        if stanza.name == "iq", stanza.attribute("type") == "result", stanza.attribute("id") == drainingPingID {
            drainingRead = true
            simulator.record(.drainingRead(session: id))
            return
        }
        guard stanza.name == "message" else { return }
        let stanzaID = stanza.attribute("id")
        guard let payload = CCSStanza.payload(of: stanza) else {
            simulator.record(.violation(session: id, .malformedStanza("<message> without a <gcm> payload")))
            loop.write(stanzaError(id: stanzaID, condition: "bad-request", text: "InvalidJson: missing gcm element"))
            return
        }
        let json: JSONValue
        do {
            json = try JSONValue.parse(payload)
        } catch {
            simulator.record(.violation(session: id, .malformedStanza("payload is not JSON")))
            loop.write(stanzaError(id: stanzaID, condition: "bad-request", text: "InvalidJson: \(payload.prefix(80))"))
            return
        }
        let messageType = json["message_type"]?.stringValue
        let messageID = json["message_id"]?.stringValue
        switch messageType {
        case "ack":
            guard let messageID else {
                simulator.record(.violation(session: id, .malformedStanza("ack without message_id")))
                return
            }
            // Matched in one pass per loop turn (`settleAcks`), not one lock per ack.
            pendingAcks.append((messageID, json["to"]?.stringValue))
        case "nack":
            simulator.record(.violation(session: id, .nackFromServer(messageID ?? "?")))
        case nil:
            receiveDownstream(json, messageID: messageID, stanzaID: stanzaID, loop)
        case let other?:
            simulator.record(.violation(session: id, .malformedStanza("unexpected message_type \(other)")))
            loop.write(stanzaError(id: stanzaID, condition: "bad-request", text: "InvalidJson: unexpected message_type"))
        }
    }

    private func receiveDownstream(_ json: JSONValue, messageID: String?, stanzaID: String?, _ loop: StreamLoop) {
        guard let messageID, !messageID.isEmpty else {
            simulator.record(.violation(session: id, .malformedStanza("downstream message without message_id")))
            loop.write(stanzaError(id: stanzaID, condition: "bad-request", text: "InvalidJson: MISSING_MESSAGE_ID"))
            return
        }
        simulator.record(.downstreamReceived(session: id, messageID: messageID))
        if draining {
            // CCS nacks it. It is the client's fault only once the client has read the control
            // message (it answered the ping that followed) and had `drainingGrace` to stop:
            // messages it had queued before reading it cross it on the wire.
            if drainingRead, let sentAt = drainingSentAt, ContinuousClock.now - sentAt > config.drainingGrace {
                simulator.record(.violation(session: id, .sentWhileDraining(messageID)))
            }
            answer(messageID, stanzaID: stanzaID, to: json["to"]?.stringValue, .nack(error: "CONNECTION_DRAINING"), loop)
            return
        }
        pendingDownstream.insert(messageID)
        simulator.notePending(pendingDownstream.count)
        if pendingDownstream.count > config.maxPendingDownstream {
            simulator.record(.violation(session: id, .windowExceeded(pending: pendingDownstream.count)))
        }
        let response: DownstreamResponse
        if json["to"] == nil && json["condition"] == nil {
            response = .nack(error: "INVALID_JSON", description: "Missing to or condition")
        } else {
            response = config.responder(DownstreamRequest(session: id, messageID: messageID, json: json))
        }
        var receipt: (json: String, id: String)?
        if case .ack = response, json["delivery_receipt_requested"] == .bool(true) {
            let receiptID = "dr2:\(messageID)"
            let body: JSONValue = .object([
                "message_type": .string("receipt"), "message_id": .string(receiptID),
                "from": .string("gcm.googleapis.com"), "category": .string("com.example.app"),
                "data": .object([
                    "message_status": .string("MESSAGE_SENT_TO_DEVICE"),
                    "original_message_id": .string(messageID),
                    "device_registration_id": .string(json["to"]?.stringValue ?? ""),
                    "message_sent_timestamp": .string(String(Int(Date().timeIntervalSince1970 * 1000))),
                ]),
            ])
            receipt = (body.serialized, receiptID)
        }
        if case .stanzaErrorWithoutID(let condition, let text, let echoing) = response {
            pendingDownstream.remove(messageID)
            loop.write(stanzaError(id: nil, condition: condition, text: text, echoing: echoing ? json.serialized : nil))
            simulator.record(.downstreamAnswered(session: id, messageID: messageID, response: response))
            return
        }
        answer(messageID, stanzaID: stanzaID, to: json["to"]?.stringValue, response, receipt: receipt, loop)
    }

    /// Queues a receipt as an upstream message of this session (FCM sends it after the ack).
    private func queueReceipt(_ receipt: (json: String, id: String)) {
        simulator.injectRaw(json: receipt.json, messageID: receipt.id, from: "gcm.googleapis.com", session: id)
        simulator.record(.receiptSent(session: id, messageID: receipt.id))
    }

    private func answer(_ messageID: String, stanzaID: String?, to: String?, _ response: DownstreamResponse,
                        receipt: (json: String, id: String)? = nil, _ loop: StreamLoop) {
        let json: String
        let delay: Duration
        switch response {
        case .noAnswer, .stanzaErrorWithoutID:
            return
        case .ack(let ackDelay, let canonical):
            json = CCSSimulator.answerJSON(error: nil, errorDescription: nil, from: to, messageID: messageID, messageType: "ack",
                                           registrationID: canonical)
            delay = ackDelay
        case .nack(let error, let description, let nackDelay):
            json = CCSSimulator.answerJSON(error: error, errorDescription: description, from: to, messageID: messageID,
                                           messageType: "nack", registrationID: nil)
            delay = nackDelay
        case .stanzaError(let condition, let text):
            pendingDownstream.remove(messageID)
            // CCS echoes the stanza's id attribute, not the JSON message_id.
            loop.write(stanzaError(id: stanzaID, condition: condition, text: text))
            simulator.record(.downstreamAnswered(session: id, messageID: messageID, response: response))
            return
        }
        let stanza = CCSStanza.message(json: json)
        let event = SimulatorEvent.downstreamAnswered(session: id, messageID: messageID, response: response)
        if delay <= .zero {
            pendingDownstream.remove(messageID)
            loop.write(stanza)
            simulator.record(event)
            if let receipt { queueReceipt(receipt) }
        } else {
            let item = Scheduled(due: .now + delay, stanza: stanza, event: event, freesSlotOf: messageID, receipt: receipt)
            // Usually due after everything scheduled (one delay for all): search from the end.
            var index = scheduled.endIndex
            while index > scheduled.startIndex, scheduled[index - 1].due > item.due { index -= 1 }
            scheduled.insert(item, at: index)
        }
    }

    private func stanzaError(id stanzaID: String?, condition: String, text: String, echoing payload: String? = nil) -> String {
        var stanza = "<message type=\"error\""
        if let stanzaID {
            stanza += " id=\""
            XMLEscaping.appendAttribute(stanzaID, to: &stanza)
            stanza += "\""
        }
        stanza += ">"
        if let payload {
            stanza += "<gcm xmlns=\"google:mobile:data\">"
            XMLEscaping.appendText(payload, to: &stanza)
            stanza += "</gcm>"
        }
        stanza += "<error code=\"400\" type=\"modify\"><\(condition) xmlns=\"\(XMPPNamespace.stanzas)\"/>"
        stanza += "<text xmlns=\"\(XMPPNamespace.stanzas)\">\(XMLEscaping.escapeText(text))</text></error></message>"
        return stanza
    }
}

extension CCSSimulator {
    /// The JSON of an ack or nack: the bytes `JSONValue.object(…).serialized` makes (members
    /// in key order, absent ones left out), written directly, since building and sorting a
    /// dictionary for every answer was about a tenth of the simulator's CPU at 16@20.
    package static func answerJSON(error: String?, errorDescription: String?, from: String?, messageID: String, messageType: String,
                                   registrationID: String?) -> String {
        var json = "{"
        json.reserveCapacity(96 + messageID.utf8.count + (from?.utf8.count ?? 0) + (error?.utf8.count ?? 0)
                             + (errorDescription?.utf8.count ?? 0) + (registrationID?.utf8.count ?? 0))
        // In key order, as a serialised dictionary would have them; each piece appended in
        // place (this runs once per downstream message).
        func member(_ key: String, _ value: String?) {
            guard let value else { return }
            if json.utf8.count > 1 { json += "," }
            json += "\""
            json += key
            json += "\":"
            JSONValue.appendQuoted(value, to: &json)
        }
        member("error", error)
        member("error_description", errorDescription)
        member("from", from)
        member("message_id", messageID)
        member("message_type", messageType)
        member("registration_id", registrationID)
        json += "}"
        return json
    }
}
