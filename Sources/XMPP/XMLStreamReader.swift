import Transport

/// The XML side of a stream loop's reading, for the stream's driver (client or server):
/// bytes go through a fresh `XMLStreamParser` per stream (re)start, and the events they
/// complete go to the driver in order. A malformed stream ends the loop.
package final class XMLStreamReader {
    private let maxStanzaBytes: Int
    private let maxDepth: Int
    private let skipsOversizedStanzas: Bool
    private var parser: XMLStreamParser
    /// Counts stream restarts: events of a replaced parser are stale.
    private var generation = 0

    package init(maxStanzaBytes: Int, maxDepth: Int, skipsOversizedStanzas: Bool = false) {
        self.maxStanzaBytes = maxStanzaBytes
        self.maxDepth = maxDepth
        self.skipsOversizedStanzas = skipsOversizedStanzas
        self.parser = XMLStreamParser(maxStanzaBytes: maxStanzaBytes, maxDepth: maxDepth, skipsOversizedStanzas: skipsOversizedStanzas)
    }

    /// Replaces the parser for a stream restart (after SASL success): the peer's next
    /// bytes open a new stream.
    package func restart() {
        parser = XMLStreamParser(maxStanzaBytes: maxStanzaBytes, maxDepth: maxDepth, skipsOversizedStanzas: skipsOversizedStanzas)
        generation += 1
    }

    /// Parses `bytes` and hands each completed event to `handle`, stopping when the stream
    /// restarts, closes or ends meanwhile. Aborts `loop` on malformed input, after handing
    /// on the events completed before it (however the bytes were split into reads).
    package func read(_ bytes: UnsafeRawBufferPointer, on loop: StreamLoop, _ handle: (XMLStreamEvent) -> Void) {
        let parser = self.parser
        let generation = self.generation
        let failure: XMLStreamError?
        do {
            let (events, parseFailure) = parser.parse(bytes)
            failure = parseFailure
            for event in events {
                if loop.isEnded || loop.isClosing || self.generation != generation { break }
                handle(event)
            }
        }
        // The events are let go of above, so their list keeps its buffer.
        parser.releaseEvents()
        if let failure, self.generation == generation {
            loop.abort(reason: XMPPError.malformedStream(failure))
        }
    }
}
