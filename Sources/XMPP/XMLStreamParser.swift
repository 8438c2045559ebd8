internal import CExpat
#if canImport(Glibc)
import Glibc
#endif

/// What the streaming parser found in the bytes fed to it.
public enum XMLStreamEvent: Sendable, Equatable {
    /// The `<stream:stream>` header, as an element without children.
    case streamOpened(XMLElement)
    /// One complete top-level element of the stream (a stanza or a negotiation element).
    case stanza(XMLElement)
    /// `</stream:stream>`.
    case streamClosed
    /// A top-level element that grew past the size limit, read to its end without being
    /// kept (only with `skipsOversizedStanzas`).
    case oversizedStanza(OversizedStanza)
}

/// What is kept of a stanza too large to keep: its name and attributes, its size, the first
/// bytes of its text, and the top-level string members of the JSON its text holds (a CCS
/// stanza's `message_id` and `from`), so that it can still be acked and set aside.
public struct OversizedStanza: Sendable, Equatable {
    public let name: String
    public let namespace: String?
    public let attributes: [XMLElement.Attribute]
    /// The stanza's size on the wire, in bytes.
    public let byteCount: Int
    /// The first bytes of its character data (of every element, in order), at most
    /// `XMLStreamParser.oversizedSampleBytes`.
    public let textSample: String
    /// The top-level string members of its character data read as one JSON object.
    public let members: [String: String]

    /// The value of the unprefixed attribute `name`, if present.
    public func attribute(_ name: String) -> String? {
        attributes.first { $0.name == name && $0.namespace == nil }?.value
    }

    public init(name: String, namespace: String?, attributes: [XMLElement.Attribute], byteCount: Int, textSample: String,
                members: [String: String]) {
        self.name = name
        self.namespace = namespace
        self.attributes = attributes
        self.byteCount = byteCount
        self.textSample = textSample
        self.members = members
    }
}

/// Why the incoming stream cannot be parsed further. The connection must end.
public enum XMLStreamError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The bytes are not well-formed XML (expat's reason, with the line and column).
    case malformed(String)
    /// A stanza grew past the size limit.
    case stanzaTooLarge(limit: Int)
    /// Elements nest deeper than the limit.
    case tooDeep(limit: Int)
    /// A DOCTYPE or entity declaration, which XMPP forbids (and which entity bombs need).
    case declarationForbidden
    /// The root element is not `<stream:stream>` in the streams namespace.
    case notAStream(String)
    /// Character data directly inside the stream element (only whitespace may be there).
    case textOutsideStanza

    public var description: String {
        switch self {
        case .malformed(let reason): "malformed XML: \(reason)"
        case .stanzaTooLarge(let limit): "a stanza exceeded the \(limit)-byte limit"
        case .tooDeep(let limit): "elements nested deeper than \(limit) levels"
        case .declarationForbidden: "a DOCTYPE or entity declaration was sent; XMPP forbids them"
        case .notAStream(let name): "the stream's root element is <\(name)>, not <stream:stream>"
        case .textOutsideStanza: "text outside any stanza"
        }
    }
}

/// Streaming parser for one XMPP stream over expat, with namespaces resolved.
///
/// Feed it bytes as they arrive, split anywhere: each complete top-level element comes out
/// whole, once. Whitespace between stanzas (keepalives) is ignored. It refuses DTDs and
/// entity declarations, and nesting over `maxDepth`; after the first error every further
/// feed fails with the same error. A stanza over `maxStanzaBytes` is an error, or, with
/// `skipsOversizedStanzas`, is read to its end without being kept and comes out as an
/// `OversizedStanza` (the stream goes on); a single tag, or other token, longer than four
/// times the limit is an error either way (expat must hold it whole).
///
/// Not thread-safe: one owner (the connection's thread) uses it. A stream restart (after
/// SASL) takes a new parser.
public final class XMLStreamParser {
    /// Default maximum size of one stanza: 1 MiB.
    public static let defaultMaxStanzaBytes = 1 << 20
    /// Default maximum element depth below the stream element.
    public static let defaultMaxDepth = 32

    public var maxStanzaBytes: Int { state.pointee.maxStanzaBytes }
    public var maxDepth: Int { state.pointee.maxDepth }
    /// Whether a stanza over `maxStanzaBytes` is read on and reported as oversized (true)
    /// or ends the stream (false).
    public var skipsOversizedStanzas: Bool { state.pointee.skipsOversizedStanzas }
    /// How much of an oversized stanza's character data is kept.
    public static let oversizedSampleBytes = 4096

    /// The expat parser (its limits and its handle are kept in `state`, which the
    /// callbacks read).
    private var parser: XML_Parser { state.pointee.parser }
    /// What the expat callbacks build, in memory this parser allocates once and frees in
    /// `deinit`. The callbacks reach it through this pointer rather than through stored
    /// properties of the class: every access to a class's `var` is checked for exclusivity
    /// at run time (a call into the Swift runtime and its thread-local access set), which
    /// was about a twentieth of a connection thread's CPU with a dozen accesses per element.
    /// Each use here is one access that ends before the next begins; none spans `XML_Parse`,
    /// whose callbacks change the state.
    private let state: UnsafeMutablePointer<State>

    public init(maxStanzaBytes: Int = XMLStreamParser.defaultMaxStanzaBytes, maxDepth: Int = XMLStreamParser.defaultMaxDepth,
                skipsOversizedStanzas: Bool = false) {
        guard let parser = XML_ParserCreateNS("UTF-8", 0x01) else {
            fatalError("expat could not allocate a parser (out of memory)")
        }
        state = .allocate(capacity: 1)
        state.initialize(to: State(parser: parser, maxStanzaBytes: maxStanzaBytes, maxDepth: maxDepth,
                                   skipsOversizedStanzas: skipsOversizedStanzas))
        XML_SetUserData(parser, UnsafeMutableRawPointer(state))
        // Every stanza as soon as its last byte is read: expat's reparse deferral (a guard
        // against re-parsing one huge token fed in tiny pieces, which the stanza size limit
        // bounds here) would hold a stanza back until more bytes came.
        _ = shim_disable_reparse_deferral(parser)
        XML_SetElementHandler(parser, { user, name, attributes in
            State.at(user).pointee.startElement(name, attributes)
        }, { user, name in
            State.at(user).pointee.endElement()
        })
        XML_SetCharacterDataHandler(parser, { user, bytes, length in
            State.at(user).pointee.characters(bytes, Int(length))
        })
        XML_SetStartDoctypeDeclHandler(parser, { user, _, _, _, _ in
            State.at(user).pointee.fail(.declarationForbidden)
        })
        XML_SetEntityDeclHandler(parser, { user, _, _, _, _, _, _, _, _ in
            State.at(user).pointee.fail(.declarationForbidden)
        })
    }

    deinit {
        XML_ParserFree(parser)
        state.deinitialize(count: 1)
        state.deallocate()
    }

    /// Parses the next bytes of the stream: the events they complete, in order, and the
    /// failure that ended the stream, if one did. Events completed before a failure in the
    /// same bytes are returned with it, so that what a stream yields does not depend on how
    /// its bytes were split into reads.
    public func parse(_ bytes: UnsafeRawBufferPointer) -> (events: [XMLStreamEvent], failure: XMLStreamError?) {
        if let failure = state.pointee.failure { return ([], failure) }
        // 0x00, 0xFE and 0xFF never occur in UTF-8. Refused here, before expat: at the start
        // of a stream expat takes "\n\0" or a FE FF byte order mark for UTF-16 even when told
        // UTF-8, but only if both bytes come in one read (found by fuzzing:
        // Fuzz/regressions/xml-utf16-guess-depends-on-the-split). What comes before the byte
        // is parsed first, so the result does not depend on the split.
        if let bad = Self.firstByteOutsideUTF8(bytes) {
            let (events, failure) = parse(UnsafeRawBufferPointer(rebasing: bytes[..<bad]))
            if let failure { return (events, failure) }
            let refusal = XMLStreamError.malformed(String(format: "a 0x%02X byte, which UTF-8 cannot contain", bytes[bad]))
            state.pointee.failure = refusal
            return (events, refusal)
        }
        state.pointee.fedBytes += Int(bytes.count)
        // The last parse's events, unless `releaseEvents()` emptied them already.
        state.pointee.events.removeAll(keepingCapacity: true)
        // No access to the state is under way here: the callbacks change it.
        let status = bytes.withMemoryRebound(to: CChar.self) { chars in
            XML_Parse(parser, chars.baseAddress, Int32(chars.count), 0)
        }
        return state.pointee.finishParse(failed: status.rawValue == shim_XML_STATUS_ERROR())
    }

    /// Empties the events the last `parse` returned, keeping their list's buffer for the next
    /// one: call it once done with them (and no longer holding them). Emptied as they were
    /// handed over, the list allocated a new buffer for every read (a read's worth, about
    /// 9 KB: a request that size makes glibc consolidate its fast bins first, a walk of every
    /// small block freed since); left for the next parse, the events were destroyed a read
    /// later, out of the cache (their destruction went from 1.5 to 3.1 % of the worker's CPU
    /// per upstream message). The next `parse` empties them if this was not called.
    public func releaseEvents() {
        state.pointee.events.removeAll(keepingCapacity: true)
    }

    /// The offset of the first 0x00, 0xFE or 0xFF in `bytes` (memchr: the common case, none,
    /// costs three vectorised scans).
    private static func firstByteOutsideUTF8(_ bytes: UnsafeRawBufferPointer) -> Int? {
        guard let base = bytes.baseAddress, !bytes.isEmpty else { return nil }
        var first: Int?
        for byte: Int32 in [0x00, 0xFE, 0xFF] {
            if let found = memchr(base, byte, bytes.count) {
                let offset = base.distance(to: UnsafeRawPointer(found))
                first = min(first ?? offset, offset)
            }
        }
        return first
    }

    /// Parses the next bytes of the stream and returns the events they complete, in order.
    /// - Throws: `XMLStreamError`, dropping the events completed before it in these bytes
    ///   (`parse` keeps them); the stream cannot continue after one.
    public func feed(_ bytes: UnsafeRawBufferPointer) throws(XMLStreamError) -> [XMLStreamEvent] {
        let (events, failure) = parse(bytes)
        if let failure { throw failure }
        return events
    }

    /// Parses `bytes` (convenience for tests and callers holding an array).
    public func feed(_ bytes: [UInt8]) throws(XMLStreamError) -> [XMLStreamEvent] {
        do {
            return try bytes.withUnsafeBytes { buffer in try feed(buffer) }
        } catch let error as XMLStreamError {
            throw error
        } catch {
            fatalError("unreachable: feed throws only XMLStreamError")
        }
    }

    /// Parses the UTF-8 of `string`.
    public func feed(_ string: String) throws(XMLStreamError) -> [XMLStreamEvent] {
        try feed(Array(string.utf8))
    }

    /// The stream as parsed so far, and the expat callbacks that build it.
    private struct State {
        /// The stanza being read past the limit.
        struct Skipped {
            let element: XMLElement
            var sample: [UInt8] = []
            var scanner = JSONMemberScanner()

            mutating func read(_ bytes: UnsafeRawBufferPointer) {
                if sample.count < XMLStreamParser.oversizedSampleBytes {
                    sample.append(contentsOf: bytes.prefix(XMLStreamParser.oversizedSampleBytes - sample.count))
                }
                scanner.feed(bytes)
            }
        }

        let parser: XML_Parser
        let maxStanzaBytes: Int
        let maxDepth: Int
        let skipsOversizedStanzas: Bool
        /// Names (split at expat's namespace separator) and attribute values the stream repeats.
        var names = RecentStrings<(namespace: String?, name: String)>()
        var attributeValues = RecentStrings<String>()
        /// Elements under construction; index 0 is the stanza, deeper ones its descendants.
        var open: [XMLElement] = []
        var text: [UInt8] = []
        /// Open elements including the stream root.
        var depth = 0
        var events: [XMLStreamEvent] = []
        var failure: XMLStreamError?
        /// Total bytes fed so far, and the stream offset where the current stanza (or the gap
        /// before it) began: their difference bounds how much one stanza may buffer.
        var fedBytes: Int = 0
        var boundary: Int = 0
        /// Where the last callback's bytes ended: what expat holds past it is one token.
        var progress: Int = 0
        var skipped: Skipped?

        init(parser: XML_Parser, maxStanzaBytes: Int, maxDepth: Int, skipsOversizedStanzas: Bool) {
            self.parser = parser
            self.maxStanzaBytes = maxStanzaBytes
            self.maxDepth = maxDepth
            self.skipsOversizedStanzas = skipsOversizedStanzas
        }

        /// The state an expat callback's user data points at.
        static func at(_ user: UnsafeMutableRawPointer?) -> UnsafeMutablePointer<State> {
            user!.assumingMemoryBound(to: State.self)
        }

        /// After `XML_Parse` returned (`failed` when it reported an error): the failure it
        /// ended in, if any, and the events it completed (the next parse empties them first).
        mutating func finishParse(failed: Bool) -> (events: [XMLStreamEvent], failure: XMLStreamError?) {
            if failure == nil && failed && passedTheLimit {
                failure = .stanzaTooLarge(limit: maxStanzaBytes)
            }
            if failure == nil && failed {
                let code = XML_GetErrorCode(parser)
                let reason = XML_ErrorString(code).map { String(cString: $0) } ?? "error \(code.rawValue)"
                failure = .malformed("\(reason) at line \(XML_GetCurrentLineNumber(parser)), column \(XML_GetCurrentColumnNumber(parser))")
            }
            if skipsOversizedStanzas {
                // Read on past the limit; but one token expat must hold whole has a bound.
                if failure == nil && depth >= 1 && fedBytes - progress > tokenLimit {
                    failure = .stanzaTooLarge(limit: maxStanzaBytes)
                }
                if failure == nil && skipped == nil && !open.isEmpty && fedBytes - boundary > Int(maxStanzaBytes) {
                    startSkipping()
                }
            } else if failure == nil && depth >= 1 && fedBytes - boundary > Int(maxStanzaBytes) {
                failure = .stanzaTooLarge(limit: maxStanzaBytes)
            }
            return (events, failure)
        }

        mutating func fail(_ error: XMLStreamError) {
            guard failure == nil else { return }
            failure = passedTheLimit ? .stanzaTooLarge(limit: maxStanzaBytes) : error
            XML_StopParser(parser, shim_XML_FALSE())
        }

        /// Whether the stanza under way had passed the size limit before what expat is at now:
        /// then that is the error, as a read split there would have reported it first (found by
        /// fuzzing: Fuzz/regressions/xml-limit-before-malformed-bytes, xml-limit-before-too-deep).
        /// When oversized stanzas are skipped, passing the limit is no error: only a token past
        /// `tokenLimit` is.
        var passedTheLimit: Bool {
            if skipsOversizedStanzas { return depth >= 1 && XML_GetCurrentByteIndex(parser) - progress > tokenLimit }
            return depth >= 1 && XML_GetCurrentByteIndex(parser) - boundary > Int(maxStanzaBytes)
        }

        /// The longest token (a tag, most likely) expat may hold while oversized stanzas are
        /// skipped: four times the stanza limit.
        var tokenLimit: Int { Int(maxStanzaBytes) * 4 }

        /// The bytes of the current callback's token end here.
        mutating func noteProgress() {
            progress = XML_GetCurrentByteIndex(parser) + Int(XML_GetCurrentByteCount(parser))
        }

        /// The stanza under way passed the limit: what was built of it is read once more (its
        /// text, for the sample and the scanner) and dropped, and the rest is read without
        /// being kept.
        mutating func startSkipping() {
            guard !open.isEmpty else { return }
            skipped = Self.skipped(reading: open, pending: text)
            text.removeAll()
            open.removeAll()
        }

        /// What is kept of a stanza past the limit, from what was built of it: `elements`, the
        /// stanza and its open descendants in order, and `pending` text not yet in them.
        static func skipped(reading elements: [XMLElement], pending: [UInt8]) -> Skipped {
            let top = elements[0]
            var skipping = Skipped(element: XMLElement(name: top.name, namespace: top.namespace, attributeList: top.attributes, children: []))
            func readText(of element: XMLElement) {
                for child in element.children {
                    switch child {
                    case .text(let text): Array(text.utf8).withUnsafeBytes { skipping.read($0) }
                    case .element(let element): readText(of: element)
                    }
                }
            }
            for element in elements {
                readText(of: element)
            }
            pending.withUnsafeBytes { skipping.read($0) }
            return skipping
        }

        /// The event of a stanza read past the limit, which ends at the current callback.
        func oversizedEvent(_ stanza: Skipped) -> XMLStreamEvent {
            let end = XML_GetCurrentByteIndex(parser) + Int(XML_GetCurrentByteCount(parser))
            return .oversizedStanza(OversizedStanza(
                name: stanza.element.name, namespace: stanza.element.namespace, attributes: stanza.element.attributes,
                byteCount: end - boundary, textSample: String(decoding: stanza.sample, as: UTF8.self), members: stanza.scanner.members))
        }

        mutating func startElement(_ rawName: UnsafePointer<CChar>?, _ rawAttributes: UnsafeMutablePointer<UnsafePointer<CChar>?>?) {
            guard failure == nil, let rawName else { return }
            let (namespace, name) = names.value(for: rawName, make: Self.split)
            var attributes: [XMLElement.Attribute] = []
            if var cursor = rawAttributes {
                // Sized once: growing it one attribute at a time allocated twice for a stanza's two.
                var count = 0
                while cursor[2 * count] != nil { count += 1 }
                attributes.reserveCapacity(count)
                while let key = cursor.pointee, let value = cursor.advanced(by: 1).pointee {
                    let (attributeNamespace, attributeName) = names.value(for: key, make: Self.split)
                    attributes.append(.init(name: attributeName, namespace: attributeNamespace,
                                            value: attributeValues.value(for: value, make: String.init(cString:))))
                    cursor = cursor.advanced(by: 2)
                }
            }
            depth += 1
            noteProgress()
            if skipsOversizedStanzas && Int(XML_GetCurrentByteCount(parser)) > tokenLimit {
                fail(.stanzaTooLarge(limit: maxStanzaBytes))
                return
            }
            if skipped != nil {
                if depth - 1 > maxDepth { fail(.tooDeep(limit: maxDepth)) }
                return
            }
            let element = XMLElement(name: name, namespace: namespace, attributeList: attributes, children: [])
            if depth == 1 {
                guard name == "stream", namespace == XMPPNamespace.streams else {
                    fail(.notAStream(name))
                    return
                }
                events.append(.streamOpened(element))
                markBoundary()
                return
            }
            if depth - 1 > maxDepth {
                fail(.tooDeep(limit: maxDepth))
                return
            }
            if depth == 2 {
                boundary = XML_GetCurrentByteIndex(parser)
            } else {
                flushText()
            }
            open.append(element)
            checkStanzaSize()
        }

        mutating func endElement() {
            guard failure == nil else { return }
            depth -= 1
            noteProgress()
            if depth == 0 {
                events.append(.streamClosed)
                return
            }
            if let stanza = skipped {
                guard depth == 1 else { return }
                events.append(oversizedEvent(stanza))
                skipped = nil
                markBoundary()
                return
            }
            flushText()
            let element = open.removeLast()
            if open.isEmpty {
                // Completed past the limit (in one read, no callback saw it pass): oversized too.
                if skipsOversizedStanzas && XML_GetCurrentByteIndex(parser) + Int(XML_GetCurrentByteCount(parser)) - boundary > Int(maxStanzaBytes) {
                    events.append(oversizedEvent(Self.skipped(reading: [element], pending: [])))
                    markBoundary()
                    return
                }
                checkStanzaSize()
                guard failure == nil else { return }
                events.append(.stanza(element))
                markBoundary()
            } else {
                open[open.count - 1].children.append(.element(element))
            }
        }

        mutating func characters(_ bytes: UnsafePointer<CChar>?, _ length: Int) {
            guard failure == nil, let bytes, length > 0 else { return }
            noteProgress()
            let buffer = UnsafeRawBufferPointer(start: bytes, count: length)
            if skipped != nil {
                skipped?.read(buffer)
                return
            }
            if depth <= 1 {
                if buffer.contains(where: { !($0 == 0x20 || $0 == 0x09 || $0 == 0x0A || $0 == 0x0D) }) {
                    fail(.textOutsideStanza)
                } else {
                    markBoundary()
                }
                return
            }
            text.append(contentsOf: buffer)
            checkStanzaSize()
        }

        mutating func flushText() {
            guard !text.isEmpty, !open.isEmpty else { return }
            open[open.count - 1].children.append(.text(String(decoding: text, as: UTF8.self)))
            text.removeAll(keepingCapacity: true)
        }

        mutating func markBoundary() {
            boundary = XML_GetCurrentByteIndex(parser) + Int(XML_GetCurrentByteCount(parser))
        }

        mutating func checkStanzaSize() {
            let end = XML_GetCurrentByteIndex(parser) + Int(XML_GetCurrentByteCount(parser))
            guard end - boundary > Int(maxStanzaBytes) else { return }
            if skipsOversizedStanzas {
                startSkipping()
            } else {
                fail(.stanzaTooLarge(limit: maxStanzaBytes))
            }
        }

        /// Splits expat's `namespace\u{1}local` form.
        static func split(_ raw: UnsafePointer<CChar>) -> (namespace: String?, name: String) {
            let full = String(cString: raw)
            guard let separator = full.utf8.firstIndex(of: 0x01) else { return (nil, full) }
            let namespace = String(full.utf8[full.utf8.startIndex..<separator])!
            let name = String(full.utf8[full.utf8.index(after: separator)...])!
            return (namespace, name)
        }
    }
}
