import FCM
import Testing
import XMPP

@Suite struct CCSMessageTests {
    @Test func upstreamMessagesKeepTheirFieldsAndRawJSON() throws {
        let message = try CCSMessage.decode(json: "{\"from\":\"tok\",\"category\":\"com.app\",\"message_id\":\"m1\",\"time_to_live\":86400,\"data\":{\"a\":\"b\",\"n\":3}}")
        guard case .upstream(let upstream) = message else { Issue.record("\(message)"); return }
        #expect(upstream.messageID == "m1")
        #expect(upstream.from == "tok")
        #expect(upstream.category == "com.app")
        #expect(upstream.data["a"] == .string("b"))
        #expect(upstream.data["n"] == .number(3))
        #expect(upstream.raw["time_to_live"] == .number(86400))
    }

    @Test func theDataTextIsKeptExactlyAsReceived() throws {
        func dataJSON(_ json: String) throws -> String? {
            guard case .upstream(let upstream) = try CCSMessage.decode(json: json) else { return nil }
            return upstream.dataJSON
        }
        // Every digit of a large number, the members' order and spacing, nested values.
        #expect(try dataJSON("{\"message_id\":\"m\",\"data\": {\"z\":12345678901234567890, \"a\":[1.50,{\"k\":\"\\u00e9\"}]},\"from\":\"t\"}")
                == "{\"z\":12345678901234567890, \"a\":[1.50,{\"k\":\"\\u00e9\"}]}")
        #expect(try dataJSON("{\"message_id\":\"m\",\"from\":\"t\"}") == "{}")
        #expect(try dataJSON("{\"message_id\":\"m\",\"data\":\"not an object\"}") == "{}")
        // A nested member named data is not the message's.
        #expect(try dataJSON("{\"x\":{\"data\":{\"inner\":1}},\"data\":{\"outer\":2}}") == "{\"outer\":2}")
        // A repeated member counts once, the last, as its parsed value does.
        #expect(try dataJSON("{\"data\":{\"first\":1},\"data\":{\"second\":2}}") == "{\"second\":2}")
    }

    @Test func everyMessageTypeIsClassified() throws {
        #expect(try CCSMessage.decode(json: "{\"message_type\":\"ack\",\"message_id\":\"d1\",\"from\":\"tok\",\"registration_id\":\"new\"}")
                == .ack(messageID: "d1", from: "tok", canonicalRegistrationID: "new"))
        #expect(try CCSMessage.decode(json: "{\"message_type\":\"nack\",\"message_id\":\"d2\",\"from\":\"tok\",\"error\":\"BAD_REGISTRATION\",\"error_description\":\"x\"}")
                == .nack(messageID: "d2", from: "tok", error: "BAD_REGISTRATION", description: "x", canonicalRegistrationID: nil))
        #expect(try CCSMessage.decode(json: "{\"message_type\":\"control\",\"control_type\":\"CONNECTION_DRAINING\"}")
                == .control(type: "CONNECTION_DRAINING"))
        guard case .receipt(let receipt) = try CCSMessage.decode(json: "{\"message_type\":\"receipt\",\"message_id\":\"dr2:1\",\"from\":\"gcm.googleapis.com\"}") else {
            Issue.record("receipt not classified")
            return
        }
        #expect(receipt.messageID == "dr2:1")
    }

    @Test func badPayloadsAreTypedErrors() {
        #expect(throws: CCSMessage.DecodingError.notAnObject) { try CCSMessage.decode(json: "[1]") }
        #expect(throws: CCSMessage.DecodingError.unknownMessageType("bogus")) { try CCSMessage.decode(json: "{\"message_type\":\"bogus\"}") }
        #expect(throws: CCSMessage.DecodingError.missingField("message_id", messageType: "ack")) { try CCSMessage.decode(json: "{\"message_type\":\"ack\"}") }
        do {
            _ = try CCSMessage.decode(json: "{not json")
            Issue.record("accepted broken JSON")
        } catch {
            guard case .notJSON = error else { Issue.record("\(error)"); return }
        }
    }

    @Test func theAckStanzaEscapesAndRoundTrips() throws {
        let stanza = CCSStanza.ack(to: "tok\"<&>", messageID: "m\\1")
        let parser = XMLStreamParser()
        _ = try parser.feed("<stream:stream xmlns:stream=\"http://etherx.jabber.org/streams\" xmlns=\"jabber:client\">")
        guard case .stanza(let element)? = try parser.feed(stanza).first, let json = CCSStanza.payload(of: element) else {
            Issue.record("the ack stanza did not parse")
            return
        }
        #expect(try JSONValue.parse(json) == .object(["to": .string("tok\"<&>"), "message_id": .string("m\\1"), "message_type": .string("ack")]))
    }
}
