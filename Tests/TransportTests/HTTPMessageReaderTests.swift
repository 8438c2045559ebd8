import Testing
@testable import Transport

@Suite struct HTTPMessageReaderTests {
    private static func feed(_ reader: inout HTTPMessageReader, _ text: String) throws -> HTTPMessage? {
        reader.append(ArraySlice(Array(text.utf8)))
        return try reader.next()
    }

    @Test func aHeadThatExpects100ContinueAsksOnceUntilItsBodyCame() throws {
        var reader = HTTPMessageReader()
        let head = "POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n"
        #expect(try Self.feed(&reader, head) == nil)
        do { let asked = reader.takeContinueRequest(); #expect(asked) }
        do { let asked = reader.takeContinueRequest(); #expect(!asked, "asked once") }
        #expect(try Self.feed(&reader, "ab") == nil)
        do { let asked = reader.takeContinueRequest(); #expect(!asked) }
        #expect(try Self.feed(&reader, "cd")?.body == Array("abcd".utf8))
        // The next message starts afresh.
        #expect(try Self.feed(&reader, head) == nil)
        do { let asked = reader.takeContinueRequest(); #expect(asked) }
    }

    @Test func noContinueForABodyAlreadyHereForHTTP10OrWithoutTheHeader() throws {
        var whole = HTTPMessageReader()
        #expect(try Self.feed(&whole, "POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nok") != nil)
        do { let asked = whole.takeContinueRequest(); #expect(!asked) }
        var old = HTTPMessageReader()
        #expect(try Self.feed(&old, "POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n") == nil)
        do { let asked = old.takeContinueRequest(); #expect(!asked) }
        var plain = HTTPMessageReader()
        #expect(try Self.feed(&plain, "POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n") == nil)
        do { let asked = plain.takeContinueRequest(); #expect(!asked) }
    }
}
