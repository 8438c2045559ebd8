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

    @Test func refusesWhatIsNotJSON() {
        let bad = ["", "{", "{\"a\":}", "{\"a\" 1}", "[1,]", "{\"a\":1,}", "01", "1.", "-", "tru", "\"abc", "\"\\x\"",
                   "\"a\nb\"", "{\"a\":1} x", "'single'", "\"\\ud800\"", "NaN", String(repeating: "[", count: 100) + String(repeating: "]", count: 100)]
        for text in bad {
            #expect(throws: (any Error).self, "\(text.prefix(20))") { try JSONValue.parse(text) }
        }
    }
}
