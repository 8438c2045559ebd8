import FCM
import Foundation
import Testing

@Suite struct JSONParserTests {
    @Test func parsesEveryKindOfValue() throws {
        let value = try JSONValue.parse(" {\"s\":\"a\\\"b\\\\c\\/\\n\\u00e9\\ud83d\\ude00\",\"n\":-12.5e2,\"z\":0,\"t\":true,\"f\":false,\"x\":null,\"a\":[1,[],{}]} ")
        #expect(value == .object([
            "s": .string("a\"b\\c/\né😀"), "n": .number(-1250), "z": .number(0), "t": .bool(true), "f": .bool(false),
            "x": .null, "a": .array([.number(1), .array([]), .object([:])]),
        ]))
    }

    @Test func nestedObjectsKeepTheirOwnMembersAndARepeatedNameItsLastValue() throws {
        let value = try JSONValue.parse(#"{"a":{"x":1,"y":{"z":2},"x":3},"b":[{"c":4},{},{"d":{"e":{}}}],"f":5,"b":6,"g":{"h":7}}"#)
        #expect(value == .object([
            "a": .object(["x": .number(3), "y": .object(["z": .number(2)])]),
            "b": .number(6), "f": .number(5), "g": .object(["h": .number(7)]),
        ]))
        // A member without a value fails the whole text; the next text parses on its own.
        #expect(throws: JSONParser.Failure.self) { try JSONValue.parse(#"{"a":{"b":1,"c":}}"#) }
        #expect(try JSONValue.parse(#"{"k":{"l":[{"m":null}]}}"#) == .object(["k": .object(["l": .array([.object(["m": .null])])])]))
    }

    @Test func agreesWithFoundationOnRoundTrips() throws {
        let samples = ["{\"data\":{\"k\":\"v\",\"emoji\":\"😀\",\"quote\":\"\\\"\"},\"message_id\":\"m-1\",\"time_to_live\":86400}",
                       "[0.1,1e-7,12345678901234,-0]", "\"\\u0000\\u001f\""]
        for sample in samples {
            let ours = try JSONValue.parse(sample)
            let foundation = try JSONDecoder().decode(JSONValue.self, from: Data(sample.utf8))
            #expect(ours == foundation, "\(sample)")
            #expect(try JSONValue.parse(ours.serialized) == ours)
        }
    }

    /// The wire's byte writer writes what the sorted text writer writes, but for the order
    /// of keys: the same value read back, each string escaped the same way.
    @Test func theWireBytesReadBackAsTheSameValue() throws {
        let samples = ["{\"data\":{\"k\":\"v\",\"emoji\":\"😀\",\"quote\":\"\\\"\",\"slash\":\"a\\\\b\"},\"n\":[1,-0.5,true,false,null]}",
                       "\"\\u0000\\u001f\\n\\r\\t tail\"", "[]", "{}", "\"\""]
        for sample in samples {
            let value = try JSONValue.parse(sample)
            #expect(try JSONValue.parse(String(decoding: value.wireBytes, as: UTF8.self)) == value, "\(sample)")
            if case .string = value { #expect(value.wireBytes == Array(value.serialized.utf8), "\(sample)") }
        }
    }

    @Test func refusesWhatIsNotJSON() {
        let bad = ["", "{", "{\"a\":}", "{\"a\" 1}", "[1,]", "{\"a\":1,}", "01", "1.", "-", "tru", "\"abc", "\"\\x\"",
                   "\"a\nb\"", "{\"a\":1} x", "'single'", "\"\\ud800\"", "NaN", String(repeating: "[", count: 100) + String(repeating: "]", count: 100)]
        for text in bad {
            #expect(throws: (any Error).self, "\(text.prefix(20))") { try JSONValue.parse(text) }
        }
    }

    @Test func numbersKeepTheirTextWhenWrittenBack() throws {
        let text = #"{"big":9007199254740993,"huge":1e400,"tiny":-1.50e-400,"plain":1.0}"#
        let parsed = try JSONValue.parse(text)
        #expect(parsed["big"] == .number(JSONNumber(text: "9007199254740993")!))
        #expect(parsed["big"] != .number(JSONNumber(text: "9007199254740992")!), "digits past 2^53 are kept apart")
        #expect(parsed["plain"] == .number(1), "1.0 and 1 are the same value")
        let written = parsed.serialized
        #expect(written == #"{"big":9007199254740993,"huge":1e400,"plain":1.0,"tiny":-1.50e-400}"#)
        #expect(try JSONValue.parse(written) == parsed)
        #expect(JSONNumber(Double.infinity).text == "1e999")
        #expect(JSONNumber(text: "01") == nil && JSONNumber(text: "1.") == nil && JSONNumber(text: "-") == nil)
        #expect(JSONNumber(text: "3e2")?.int64Value == 300 && JSONNumber(text: "3.5")?.int64Value == nil)
    }

    @Test func aNumberCountsAsItsTextInThePayloadSize() throws {
        let long = String(repeating: "9", count: 4000)
        let payload = try JSONValue.parse(#"{"data":{"n":\#(long)}}"#)
        let message = try DownstreamMessage(target: "token", condition: nil, payload: payload, messageID: "m")
        #expect(message.payloadBytes == 4001)
        #expect(throws: DownstreamValidationError.self) {
            try DownstreamMessage(target: "token", condition: nil,
                                  payload: try JSONValue.parse(#"{"data":{"n":\#(long)\#(long)}}"#), messageID: "m").validate()
        }
    }
}
