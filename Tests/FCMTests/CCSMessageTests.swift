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

    /// `decode` checks the text without building every value; it must refuse exactly what
    /// the full parser refuses and keep the same fields.
    @Test func decodingRefusesExactlyWhatTheParserRefuses() throws {
        func nested(_ depth: Int) -> String {
            "{\"message_id\":\"m\",\"from\":\"t\",\"data\":{\"deep\":" + String(repeating: "[", count: depth - 2)
                + String(repeating: "]", count: depth - 2) + "}}"
        }
        let samples = [
            "{\"message_id\":\"m\",\"from\":\"t\",\"category\":\"c\",\"data\":{\"a\":\"b\",\"n\":[1,2.5e3,-0,true,false,null,{}]}}",
            "{\"message_id\":\"m\\u00e9\\ud83d\\ude00\\n\",\"from\":\"t\\\"q\"}",
            "{\"message_id\":1,\"from\":\"t\",\"from\":2}", "{\"message_id\":\"a\",\"message_id\":\"b\"}",
            "{\"message\\u005fid\":\"escaped name\",\"fro\\u006d\":\"t\",\"d\\u0061ta\":{\"k\":1}}",
            "{}", " { } ", "[1,2]", "\"text\"", "12", "null",
            nested(64), nested(65),
            "", "{", "{\"a\":}", "{\"a\" 1}", "{\"a\":1,}", "{\"data\":{\"a\":[1,]}}", "{\"data\":{\"a\":01}}",
            "{\"data\":{\"a\":1.}}", "{\"data\":{\"a\":\"\\x\"}}", "{\"data\":{\"a\":\"\\ud800\"}}", "{\"data\":{\"a\":tru}}",
            "{\"data\":{\"a\":\"x\ny\"}}", "{\"data\":{\"a\" 1}}", "{\"data\":{\"a\":1}", "{\"data\":[1 2]}",
            "{\"data\":{}} x", "{\"message_id\":\"unterminated}", "{\"data\":{1:2}}",
        ]
        for sample in samples {
            let parsed = try? JSONValue.parse(sample)
            do {
                let message = try CCSMessage.decode(json: sample)
                guard case .object(let members)? = parsed else {
                    Issue.record("decoded what the parser refuses: \(sample)")
                    continue
                }
                guard case .upstream(let upstream) = message else { continue }
                #expect(upstream.messageID == members["message_id"]?.stringValue, "\(sample)")
                #expect(upstream.from == members["from"]?.stringValue, "\(sample)")
                #expect(upstream.category == members["category"]?.stringValue, "\(sample)")
                #expect(upstream.data == members["data"]?.objectValue ?? [:], "\(sample)")
                #expect(upstream.raw == parsed, "\(sample)")
            } catch {
                switch error {
                case .notJSON: #expect(parsed == nil, "refused what the parser reads: \(sample)")
                case .notAnObject: #expect(parsed != nil && parsed?.objectValue == nil, "\(sample)")
                default: Issue.record("\(error): \(sample)")
                }
            }
        }
        #expect((try? JSONValue.parse(nested(64))) != nil, "the deepest nesting allowed is in the samples")
        #expect((try? JSONValue.parse(nested(65))) == nil, "one level deeper is refused")
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

    @Test func theOnePassAckIsTheEscapedAckWhereverItApplies() {
        let token = "fZ3x-8Y_q:APA91bH" + String(repeating: "aZ09-_:.", count: 18)
        for (to, messageID) in [(token, "m-1"), ("gcm.googleapis.com", "dr2:1a2b"), ("", ""), ("~ !#$%'()*+,/;=?@[]^`{|}", "x")] {
            #expect(CCSStanza.plainAck(to: to, messageID: messageID) == CCSStanza.escapedAck(to: to, messageID: messageID))
            #expect(CCSStanza.ack(to: to, messageID: messageID) == CCSStanza.escapedAck(to: to, messageID: messageID))
        }
        // Whatever JSON or XML escapes, and anything beyond printable ASCII, takes the escaping path.
        for awkward in ["a\"b", "a\\b", "a&b", "a<b", "a>b", "a\nb", "a\u{7F}b", "é", "\u{FFFE}"] {
            #expect(CCSStanza.plainAck(to: awkward, messageID: "m") == nil)
            #expect(CCSStanza.plainAck(to: "t", messageID: awkward) == nil)
            #expect(CCSStanza.ack(to: awkward, messageID: awkward) == CCSStanza.escapedAck(to: awkward, messageID: awkward))
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
