import FCM
import Foundation
import Simulator
import Testing
import XMPP

/// The simulator enforces CCS's rules and answers in CCS's formats: a raw client breaks
/// rules on purpose and checks what comes back.
@Suite struct SimulatorFidelityTests {
    private func downstream(_ id: String, to: String = "token-1", extra: String = "", stanzaID: String? = nil) -> String {
        CCSStanza.message(json: "{\"to\":\"\(to)\",\"message_id\":\"\(id)\"\(extra),\"data\":{\"k\":\"v\"}}", id: stanzaID ?? id)
    }

    /// The JSON of the next stanza carrying a `<gcm>` payload.
    private func nextPayload(_ connection: XMPPConnection<XMLElement>) async throws -> JSONValue {
        while let stanza = await connection.next() {
            if let payload = CCSStanza.payload(of: stanza) { return try JSONValue.parse(payload) }
        }
        throw SimulatorError("the stream ended")
    }

    /// The simulator writes its acks' and nacks' JSON directly: the bytes must be those of
    /// the JSON object with the same members (keys in order, absent ones left out).
    @Test func answersAreWrittenAsTheirJSONObjectsSerialize() {
        let texts: [String?] = [nil, "plain", "quote \" back\\slash\ttab \u{1}ctl é"]
        for error in texts {
            for description in texts {
                for from in texts {
                    for registration in texts {
                        for type in ["ack", "nack"] {
                            var members: [String: JSONValue] = ["message_id": .string("m-\"1"), "message_type": .string(type)]
                            if let error { members["error"] = .string(error) }
                            if let description { members["error_description"] = .string(description) }
                            if let from { members["from"] = .string(from) }
                            if let registration { members["registration_id"] = .string(registration) }
                            let direct = CCSSimulator.answerJSON(error: error, errorDescription: description, from: from,
                                                                 messageID: "m-\"1", messageType: type, registrationID: registration)
                            #expect(direct == JSONValue.object(members).serialized)
                        }
                    }
                }
            }
        }
    }

    @Test func acksOnTheWrongConnectionOrToTheWrongAddressAreViolations() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let (first, firstSession) = try await ccs.connect()
        let (second, _) = try await ccs.connect()
        ccs.simulator.injectUpstream(from: "device-a", messageID: "u1", session: firstSession)
        ccs.simulator.injectUpstream(from: "device-a", messageID: "u2", session: firstSession)
        #expect(try await nextPayload(first)["message_id"] == .string("u1"))
        #expect(try await nextPayload(first)["message_id"] == .string("u2"))
        try await second.send(serialized: CCSStanza.ack(to: "device-a", messageID: "u1"))
        try await first.send(serialized: CCSStanza.ack(to: "someone-else", messageID: "u2"))
        try await first.send(serialized: CCSStanza.ack(to: "device-a", messageID: "never-sent"))
        try await first.send(serialized: CCSStanza.message(json: "{\"to\":\"device-a\",\"message_id\":\"u1\",\"message_type\":\"nack\"}"))
        try await ccs.simulator.wait(for: "four violations") { $0.violations.count >= 4 }
        let violations = ccs.simulator.violations
        #expect(violations.contains(.ackOnWrongConnection(messageID: "u1", deliveredOn: firstSession)))
        #expect(violations.contains(.ackToWrongAddress(messageID: "u2", expected: "device-a", got: "someone-else")))
        #expect(violations.contains(.ackForUnknownMessage("never-sent")))
        #expect(violations.contains(.nackFromServer("u1")))
        // The right ack is accepted, a second one is a duplicate.
        try await first.send(serialized: CCSStanza.ack(to: "device-a", messageID: "u1"))
        try await first.send(serialized: CCSStanza.ack(to: "device-a", messageID: "u1"))
        try await ccs.simulator.wait(for: "the duplicate") { $0.violations.contains(.duplicateAck("u1")) }
        #expect(ccs.simulator.events.acked == ["u1"])
        await first.close()
        await second.close()
    }

    /// CCS delivers a message again when it saw no ack, and a device may send one
    /// `message_id` twice: each delivery takes its own ack (before, the second was called
    /// a duplicate ack), on the connection it went out on; a third ack is a duplicate.
    @Test func eachDeliveryOfAMessageIdTakesOneAckOnItsOwnConnection() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let (first, firstSession) = try await ccs.connect()
        let (second, secondSession) = try await ccs.connect()
        ccs.simulator.injectUpstream(from: "device-a", messageID: "twice", session: firstSession)
        ccs.simulator.injectUpstream(from: "device-a", messageID: "twice", session: secondSession)
        ccs.simulator.injectUpstream(from: "device-b", messageID: "again", session: firstSession)
        ccs.simulator.injectUpstream(from: "device-b", messageID: "again", session: firstSession)
        #expect(try await nextPayload(first)["message_id"] == .string("twice"))
        #expect(try await nextPayload(second)["message_id"] == .string("twice"))
        #expect(try await nextPayload(first)["message_id"] == .string("again"))
        #expect(try await nextPayload(first)["message_id"] == .string("again"))
        try await second.send(serialized: CCSStanza.ack(to: "device-a", messageID: "twice"))
        try await first.send(serialized: CCSStanza.ack(to: "device-a", messageID: "twice"))
        try await first.send(serialized: CCSStanza.ack(to: "device-b", messageID: "again"))
        try await first.send(serialized: CCSStanza.ack(to: "device-b", messageID: "again"))
        try await ccs.simulator.wait(for: "four acks") { $0.acked.count >= 4 }
        #expect(ccs.simulator.violations.isEmpty, "\(ccs.simulator.violations)")
        try await first.send(serialized: CCSStanza.ack(to: "device-b", messageID: "again"))
        try await ccs.simulator.wait(for: "the duplicate") { $0.violations.contains(.duplicateAck("again")) }
        #expect(ccs.simulator.violations.count == 1)
        await first.close()
        await second.close()
    }

    /// A delivery not acked when its connection drops goes out again: both deliveries of a
    /// message sent twice on it, once each.
    @Test func everyUnackedDeliveryOfALostConnectionIsDeliveredAgain() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let (first, firstSession) = try await ccs.connect()
        ccs.simulator.injectUpstream(from: "device-a", messageID: "sent-twice", session: firstSession)
        ccs.simulator.injectUpstream(from: "device-a", messageID: "sent-twice", session: firstSession)
        #expect(try await nextPayload(first)["message_id"] == .string("sent-twice"))
        #expect(try await nextPayload(first)["message_id"] == .string("sent-twice"))
        await first.close()
        let (second, _) = try await ccs.connect()
        #expect(try await nextPayload(second)["message_id"] == .string("sent-twice"))
        #expect(try await nextPayload(second)["message_id"] == .string("sent-twice"))
        try await second.send(serialized: CCSStanza.ack(to: "device-a", messageID: "sent-twice"))
        try await second.send(serialized: CCSStanza.ack(to: "device-a", messageID: "sent-twice"))
        try await ccs.simulator.wait(for: "two acks") { $0.acked.count >= 2 }
        #expect(ccs.simulator.violations.isEmpty, "\(ccs.simulator.violations)")
        await second.close()
    }

    @Test func moreThanAHundredPendingIsAViolationAndOnlyAnswersFreeSlots() async throws {
        let ccs = try TestCCS(configure: { $0.responder = { _ in .noAnswer } })
        defer { ccs.simulator.stop() }
        let (connection, session) = try await ccs.connect()
        for index in 1...100 { try await connection.send(serialized: downstream("d\(index)")) }
        try await ccs.simulator.wait(for: "100 downstream") { $0.count { if case .downstreamReceived = $0 { true } else { false } } == 100 }
        #expect(ccs.simulator.violations.isEmpty)
        try await connection.send(serialized: downstream("d101"))
        try await ccs.simulator.wait(for: "the window violation") { $0.violations.contains(.windowExceeded(pending: 101)) }
        #expect(ccs.simulator.counters.violations == 1)
        _ = session
        await connection.close()
    }

    @Test func unacceptedDownstreamStanzasGetCCSStyleErrors() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let (connection, _) = try await ccs.connect()
        try await connection.send(serialized: "<message id=\"bad-1\"><gcm xmlns=\"google:mobile:data\">{broken</gcm></message>")
        guard let error = await connection.next() else { Issue.record("no answer"); return }
        #expect(error.attribute("type") == "error")
        #expect(error.attribute("id") == "bad-1")
        #expect(error.child("error")?.attribute("code") == "400")
        #expect(error.child("error")?.child("bad-request") != nil)
        #expect(error.child("error")?.child("text")?.text.hasPrefix("InvalidJson") == true)
        // No target at all: INVALID_JSON nack.
        try await connection.send(serialized: CCSStanza.message(json: "{\"message_id\":\"no-target\"}", id: "no-target"))
        let nack = try await nextPayload(connection)
        #expect(nack["message_type"] == .string("nack"))
        #expect(nack["error"] == .string("INVALID_JSON"))
        #expect(ccs.simulator.violations.contains(.malformedStanza("payload is not JSON")))
        await connection.close()
    }

    @Test func scriptedAnswersAndReceiptsHaveCCSFormats() async throws {
        let ccs = try TestCCS(configure: {
            $0.responder = { request in
                switch request.messageID {
                case "n1": .nack(error: "DEVICE_UNREGISTERED", description: "gone")
                case "c1": .ack(canonicalRegistrationID: "canonical-token")
                case "e1": .stanzaError(condition: "bad-request", text: "InvalidJson: bad field")
                default: .ack(delay: .milliseconds(50))
                }
            }
        })
        defer { ccs.simulator.stop() }
        let (connection, session) = try await ccs.connect()
        try await connection.send(serialized: downstream("n1"))
        var answer = try await nextPayload(connection)
        #expect(answer == .object(["message_type": .string("nack"), "message_id": .string("n1"), "from": .string("token-1"),
                                   "error": .string("DEVICE_UNREGISTERED"), "error_description": .string("gone")]))
        try await connection.send(serialized: downstream("c1"))
        answer = try await nextPayload(connection)
        #expect(answer["registration_id"] == .string("canonical-token"))
        #expect(answer["message_type"] == .string("ack"))
        // The stanza error echoes the stanza's id attribute, which need not be the message_id.
        try await connection.send(serialized: downstream("e1", stanzaID: "stanza-of-e1"))
        let stanzaError = await connection.next()
        #expect(stanzaError?.attribute("type") == "error" && stanzaError?.attribute("id") == "stanza-of-e1")

        // A delayed ack, then the receipt that was asked for, which must be acked in turn.
        try await connection.send(serialized: downstream("r1", extra: ",\"delivery_receipt_requested\":true,\"time_to_live\":0"))
        answer = try await nextPayload(connection)
        #expect(answer["message_type"] == .string("ack") && answer["message_id"] == .string("r1"))
        let receipt = try await nextPayload(connection)
        #expect(receipt["message_type"] == .string("receipt"))
        #expect(receipt["message_id"] == .string("dr2:r1"))
        #expect(receipt["from"] == .string("gcm.googleapis.com"))
        #expect(receipt["data"]?["original_message_id"] == .string("r1"))
        #expect(receipt["data"]?["message_status"] == .string("MESSAGE_SENT_TO_DEVICE"))
        try await connection.send(serialized: CCSStanza.ack(to: "gcm.googleapis.com", messageID: "dr2:r1"))
        try await ccs.simulator.wait(for: "the receipt's ack") { $0.acked.contains("dr2:r1") }
        #expect(ccs.simulator.violations.isEmpty)
        _ = session
        await connection.close()
    }

    @Test func drainingAnnouncesItselfAndRefusesNewSends() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let (connection, session) = try await ccs.connect()
        ccs.simulator.sendConnectionDraining(session: session)
        let control = try await nextPayload(connection)
        #expect(control == .object(["message_type": .string("control"), "control_type": .string("CONNECTION_DRAINING")]))
        // A ping follows the control message; its answer proves the client has read it.
        try await ccs.simulator.wait(for: "the drain to be read") { $0.contains(.drainingRead(session: session)) }
        try await Task.sleep(for: ccs.simulator.configuration.drainingGrace)
        try await connection.send(serialized: downstream("late"))
        let nack = try await nextPayload(connection)
        #expect(nack["error"] == .string("CONNECTION_DRAINING"))
        #expect(ccs.simulator.violations == [.sentWhileDraining("late")])
        await connection.close()
    }

    @Test func tooManyUnackedUpstreamStopsDeliveryUntilAcksArrive() async throws {
        let ccs = try TestCCS(configure: { $0.maxUnackedUpstream = 3 })
        defer { ccs.simulator.stop() }
        let (connection, _) = try await ccs.connect()
        for index in 1...5 { ccs.simulator.injectUpstream(from: "d", messageID: "q\(index)") }
        var received: [String] = []
        for _ in 1...3 { received.append(try await nextPayload(connection)["message_id"]?.stringValue ?? "?") }
        #expect(received == ["q1", "q2", "q3"])
        #expect(ccs.simulator.counters.upstreamDelivered == 3)
        try await connection.send(serialized: CCSStanza.ack(to: "d", messageID: "q1"))
        #expect(try await nextPayload(connection)["message_id"] == .string("q4"))
        await connection.close()
    }

    @Test func aPlaintextClientGetsNoXML() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        // Speak XMPP without TLS: the server expects a TLS ClientHello and never answers in XML.
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = UInt16(ccs.simulator.port).bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        #expect(connected == 0)
        let hello = Array("<stream:stream to=\"gcm.googleapis.com\" version=\"1.0\">".utf8)
        _ = hello.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        var buffer = [UInt8](repeating: 0, count: 512)
        var timeout = timeval(tv_sec: 5, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        let count = read(fd, &buffer, buffer.count)
        let reply = count > 0 ? Array(buffer[..<count]) : []
        #expect(!String(decoding: reply, as: UTF8.self).contains("<stream"))
        if let first = reply.first { #expect(first == 0x15, "a TLS alert record, not XML") }
    }
}
