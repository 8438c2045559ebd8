import Testing
@testable import XMPP

private let header = "<?xml version='1.0'?><stream:stream from=\"gcm.googleapis.com\" id=\"1\" version=\"1.0\" xmlns:stream=\"http://etherx.jabber.org/streams\" xmlns=\"jabber:client\">"

private func stanzas(_ events: [XMLStreamEvent]) -> [XMLElement] {
    events.compactMap { if case .stanza(let element) = $0 { element } else { nil } }
}

@Suite struct XMLStreamParserTests {
    @Test func prefixedAndDefaultNamespacesAreTheSameElement() throws {
        let parser = XMLStreamParser()
        let events = try parser.feed(header
            + "<message id=\"a\"><data:gcm xmlns:data=\"google:mobile:data\">{\"x\":1}</data:gcm></message>"
            + "<message id=\"b\"><gcm xmlns=\"google:mobile:data\">{\"x\":2}</gcm></message>")
        guard case .streamOpened(let root) = events.first else {
            Issue.record("no stream header event")
            return
        }
        #expect(root.name == "stream" && root.namespace == XMPPNamespace.streams)
        let messages = stanzas(events)
        #expect(messages.count == 2)
        #expect(messages.map { $0.namespace } == [XMPPNamespace.client, XMPPNamespace.client])
        #expect(messages[0].child("gcm", namespace: XMPPNamespace.gcm)?.text == "{\"x\":1}")
        #expect(messages[1].child("gcm", namespace: XMPPNamespace.gcm)?.text == "{\"x\":2}")
    }

    /// Found by fuzzing (`Fuzz/corpus/xml/broken.xml`): a stanza completed before malformed
    /// bytes in the same read was dropped with the error, but handed on when the bytes came
    /// in two reads. `parse` hands on what completed, then the failure.
    @Test func eventsBeforeAnErrorInTheSameReadAreKept() {
        let bytes = Array((header + "<message id=\"a\"><gcm xmlns=\"google:mobile:data\">{}</gcm></message><x></y>").utf8)
        let (events, failure) = bytes.withUnsafeBytes { XMLStreamParser().parse($0) }
        #expect(stanzas(events).map { $0.attribute("id") } == ["a"])
        #expect(events.count == 2)
        guard case .malformed? = failure else {
            Issue.record("expected a malformed-XML failure, got \(String(describing: failure))")
            return
        }
        let parser = XMLStreamParser()
        let split = bytes.count - 4
        let first = bytes[..<split].withUnsafeBytes { parser.parse($0) }
        let second = bytes[split...].withUnsafeBytes { parser.parse($0) }
        #expect(first.events + second.events == events)
        #expect(second.failure == failure)
    }

    /// Each parse's events are its own: emptied by `releaseEvents()` or by the next parse,
    /// never in a list a caller still holds.
    @Test func eachParseReturnsOnlyItsOwnEventsAndAHeldListKeepsItsOwn() throws {
        let parser = XMLStreamParser()
        let first = try parser.feed(header + "<message id=\"a\"/><message id=\"b\"/>")
        parser.releaseEvents()
        let second = try parser.feed("<message id=\"c\"/>")
        #expect(stanzas(first).map { $0.attribute("id") } == ["a", "b"], "a list held across the release keeps its events")
        #expect(stanzas(second).map { $0.attribute("id") } == ["c"])
        // Without a release, the next parse empties the last one's events first.
        let third = try parser.feed("<message id=\"d\"/><message id=\"e\"/>")
        #expect(stanzas(third).map { $0.attribute("id") } == ["d", "e"])
        #expect(stanzas(second).map { $0.attribute("id") } == ["c"])
        parser.releaseEvents()
        parser.releaseEvents()
        #expect(try parser.feed("<message id=\"f\"/>").count == 1)
    }

    /// Bytes UTF-8 never holds end the stream however they arrive: expat alone took a
    /// stream starting "\n\0" for UTF-16 when both bytes came in one read.
    @Test func bytesOutsideUTF8AreRefusedWhateverTheSplit() {
        for stream in [[0x0A, 0x00, 0x30, 0x00], [0xFF, 0xFE, 0x3C, 0x00], Array((header + "<message id=\"a\"/>").utf8) + [0x00, 0x3C]] as [[UInt8]] {
            let whole = stream.withUnsafeBytes { XMLStreamParser().parse($0) }
            guard case .malformed(let reason)? = whole.failure else {
                Issue.record("\(stream.prefix(4)) was not refused: \(whole)")
                continue
            }
            #expect(reason.contains("which UTF-8 cannot contain"), "\(reason)")
            for split in 1..<stream.count {
                let parser = XMLStreamParser()
                let first = stream[..<split].withUnsafeBytes { parser.parse($0) }
                let second = stream[split...].withUnsafeBytes { parser.parse($0) }
                #expect(first.events + second.events == whole.events)
                #expect((first.failure ?? second.failure) != nil)
            }
        }
        // The stanza before the bad byte still comes out.
        let bytes = Array((header + "<message id=\"a\"/>").utf8) + [0x00]
        #expect(stanzas(bytes.withUnsafeBytes { XMLStreamParser().parse($0) }.events).map { $0.attribute("id") } == ["a"])
    }

    /// Every split of a stream into two reads yields the same stanzas, once each.
    @Test func stanzasComeOutWholeAtEveryByteBoundary() throws {
        let body = "<message id=\"m&amp;1\"><gcm xmlns=\"google:mobile:data\">{\"t\":\"&lt;é€😀&gt;\"}</gcm></message> "
            + "<iq type=\"get\" id=\"p1\"><ping xmlns=\"urn:xmpp:ping\"/></iq></stream:stream>"
        let bytes = Array((header + body).utf8)
        let whole = try XMLStreamParser().feed(bytes)
        #expect(stanzas(whole).count == 2)
        #expect(whole.last == .streamClosed)
        for split in 1..<bytes.count {
            let parser = XMLStreamParser()
            let events = try parser.feed(Array(bytes[..<split])) + parser.feed(Array(bytes[split...]))
            #expect(events == whole, "split at byte \(split)")
        }
        // And one byte per read.
        let parser = XMLStreamParser()
        var events: [XMLStreamEvent] = []
        for byte in bytes { events += try parser.feed([byte]) }
        #expect(events == whole)
        #expect(stanzas(whole)[0].child("gcm")?.text == "{\"t\":\"<é€😀>\"}")
        #expect(stanzas(whole)[0].attribute("id") == "m&1")
    }

    @Test func aThousandStanzasInOneRead() throws {
        let parser = XMLStreamParser()
        var text = header
        for index in 0..<1000 { text += "<message id=\"\(index)\"><gcm xmlns=\"google:mobile:data\">{}</gcm></message>" }
        let messages = stanzas(try parser.feed(text))
        #expect(messages.count == 1000)
        #expect(messages.map { $0.attribute("id")! } == (0..<1000).map(String.init))
    }

    @Test func whitespaceKeepalivesBetweenStanzasAreIgnored() throws {
        let parser = XMLStreamParser()
        _ = try parser.feed(header)
        #expect(try parser.feed(" ").isEmpty)
        #expect(try parser.feed(" \n\t ").isEmpty)
        #expect(stanzas(try parser.feed("<message/> ")).count == 1)
    }

    @Test func textOutsideAStanzaIsRefused() throws {
        let parser = XMLStreamParser()
        _ = try parser.feed(header)
        #expect(throws: XMLStreamError.textOutsideStanza) { try parser.feed("hello<message/>") }
    }

    @Test func oversizedStanzaIsRefusedBeforeItCompletes() throws {
        let parser = XMLStreamParser(maxStanzaBytes: 1024)
        _ = try parser.feed(header)
        _ = try parser.feed("<message><body>")
        #expect(throws: XMLStreamError.stanzaTooLarge(limit: 1024)) {
            try parser.feed(String(repeating: "a", count: 2000))
        }
        // The error sticks.
        #expect(throws: XMLStreamError.stanzaTooLarge(limit: 1024)) { try parser.feed("</body></message>") }
    }

    /// With `skipsOversizedStanzas` (a client's connection to CCS), a stanza over the limit
    /// is read to its end without being kept and comes out as an `OversizedStanza`: its name,
    /// size, the first bytes of its text and the top-level string members of its JSON (a CCS
    /// message puts `message_id` and `from` after `data`). The stanzas around it come out
    /// as usual, however the bytes are split.
    @Test func anOversizedStanzaIsSkippedToItsEndAndTheStreamGoesOn() throws {
        let big = String(repeating: "x", count: 5000)
        let json = #"{"category":"com.example","data":{"text":"\#(big)","message_id":"inner"},"message_id":"m-\"1","from":"device-a"}"#
        let stream = header + "<message id=\"before\"><gcm xmlns=\"google:mobile:data\">{}</gcm></message>"
            + "<message id=\"big\"><gcm xmlns=\"google:mobile:data\">\(json.replacingOccurrences(of: "&", with: "&amp;"))</gcm></message>"
            + "<message id=\"after\"/>"
        let bytes = Array(stream.utf8)
        for split in [bytes.count, 1, 7, 1000, 4095] {
            let parser = XMLStreamParser(maxStanzaBytes: 1024, skipsOversizedStanzas: true)
            var events: [XMLStreamEvent] = []
            var offset = 0
            while offset < bytes.count {
                let end = min(bytes.count, offset + split)
                events += try parser.feed(Array(bytes[offset..<end]))
                offset = end
            }
            #expect(events.count == 4, "split \(split)")
            guard events.count == 4, case .oversizedStanza(let oversized) = events[2] else {
                Issue.record("no oversized stanza (split \(split)): \(events)")
                continue
            }
            #expect(stanzas([events[1]]).map { $0.attribute("id") } == ["before"])
            #expect(stanzas([events[3]]).map { $0.attribute("id") } == ["after"])
            #expect(oversized.name == "message" && oversized.attribute("id") == "big")
            #expect(oversized.members == ["category": "com.example", "message_id": "m-\"1", "from": "device-a"])
            #expect(oversized.textSample.utf8.count == XMLStreamParser.oversizedSampleBytes)
            #expect(oversized.textSample.hasPrefix(#"{"category":"com.example","data":{"text":"xxx"#))
            #expect(oversized.byteCount > 5000)
        }
    }

    @Test func insideASkippedStanzaDepthAndWellFormednessStillCount() throws {
        let deep = XMLStreamParser(maxStanzaBytes: 64, maxDepth: 8, skipsOversizedStanzas: true)
        _ = try deep.feed(header)
        _ = try deep.feed("<message>" + String(repeating: "y", count: 200))
        #expect(throws: XMLStreamError.tooDeep(limit: 8)) { try deep.feed(String(repeating: "<a>", count: 9)) }
        let malformed = XMLStreamParser(maxStanzaBytes: 64, skipsOversizedStanzas: true)
        _ = try malformed.feed(header)
        _ = try malformed.feed("<message>" + String(repeating: "y", count: 200))
        #expect(throws: XMLStreamError.self) { try malformed.feed("</other>") }
    }

    /// Skipping keeps nothing of a stanza, but expat must hold a tag whole: one longer than
    /// four times the limit still ends the stream, in one read or in pieces.
    @Test func aTagFourTimesTheLimitStillEndsTheStream() throws {
        let tag = "<message a=\"" + String(repeating: "z", count: 5000) + "\">"
        for split in [tag.utf8.count, 100] {
            let parser = XMLStreamParser(maxStanzaBytes: 1024, skipsOversizedStanzas: true)
            _ = try parser.feed(header)
            let bytes = Array(tag.utf8)
            var failed = false
            var offset = 0
            while offset < bytes.count, !failed {
                let end = min(bytes.count, offset + split)
                do { _ = try parser.feed(Array(bytes[offset..<end])) } catch { failed = error == .stanzaTooLarge(limit: 1024) }
                offset = end
            }
            #expect(failed, "split \(split)")
        }
    }

    @Test func stanzasJustUnderTheLimitPass() throws {
        let parser = XMLStreamParser(maxStanzaBytes: 1024)
        _ = try parser.feed(header)
        for _ in 0..<20 {  // the limit applies per stanza, not to the stream
            let stanza = "<message><body>" + String(repeating: "a", count: 900) + "</body></message>"
            #expect(stanzas(try parser.feed(stanza)).count == 1)
        }
    }

    @Test func deepNestingIsRefused() throws {
        let parser = XMLStreamParser(maxDepth: 8)
        _ = try parser.feed(header)
        #expect(throws: XMLStreamError.tooDeep(limit: 8)) {
            try parser.feed(String(repeating: "<a>", count: 9))
        }
    }

    @Test func entityBombIsRefusedNotExpanded() throws {
        let bomb = """
            <?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">\
            <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">]>\
            <stream:stream xmlns:stream="http://etherx.jabber.org/streams">&lol3;
            """
        #expect(throws: XMLStreamError.declarationForbidden) { try XMLStreamParser().feed(bomb) }
    }

    @Test func malformedXMLIsAnErrorNamingThePlace() throws {
        let parser = XMLStreamParser()
        _ = try parser.feed(header)
        do {
            _ = try parser.feed("<message><gcm></message>")
            Issue.record("mismatched tags were accepted")
        } catch {
            guard case .malformed(let reason) = error else {
                Issue.record("wrong error \(error)")
                return
            }
            #expect(reason.contains("mismatched tag"))
            #expect(reason.contains("line 1"))
        }
    }

    @Test func aRootOtherThanTheStreamIsRefused() {
        #expect(throws: XMLStreamError.notAStream("html")) { try XMLStreamParser().feed("<html>") }
    }
}

@Suite struct XMLSerializationTests {
    @Test func textAndAttributesAreEscaped() throws {
        var element = XMLElement("message", namespace: XMPPNamespace.client, attributes: ["id": "a\"b<c>&'\n"])
        element.children = [.element(XMLElement("gcm", namespace: XMPPNamespace.gcm, children: [.text("{\"a\":\"<&>\"}")]))]
        let text = element.serialized()
        #expect(text == "<message id=\"a&quot;b&lt;c&gt;&amp;&apos;&#10;\"><gcm xmlns=\"google:mobile:data\">{\"a\":\"&lt;&amp;&gt;\"}</gcm></message>")
        // Round trip through the parser gives the same element.
        let parser = XMLStreamParser()
        _ = try parser.feed(header)
        #expect(try parser.feed(text) == [.stanza(element)])
    }

    @Test func controlCharactersXMLCannotCarryAreReplaced() {
        #expect(XMLEscaping.escapeText("a\u{1}b\u{0}c\td\r") == "a\u{FFFD}b\u{FFFD}c\td&#13;")
    }
}
