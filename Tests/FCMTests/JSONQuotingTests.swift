import Testing
import FCM

/// Quoting a `String` (its fast path for text with nothing to escape, and its escapes)
/// writes what the byte version writes, and reads back as the same text.
@Suite struct JSONQuotingTests {
    @Test func aQuotedStringIsWhatTheByteVersionWrites() throws {
        let texts = ["", "plain-token_0123456789:APA91b", "with \"quotes\"", "back\\slash", "tab\there", "line\nbreak",
                     "\u{01}\u{1F}", "é😀", String(repeating: "x", count: 40) + "\"", "\"" + String(repeating: "y", count: 17)]
        for text in texts {
            var string = ""
            JSONValue.appendQuoted(text, to: &string)
            var bytes: [UInt8] = []
            JSONValue.appendQuoted(text, to: &bytes)
            #expect(string == String(decoding: bytes, as: UTF8.self), "\(text)")
            #expect(try JSONValue.parse(string) == .string(text), "\(text)")
        }
    }
}
