/// A strict JSON parser over UTF-8 bytes (RFC 8259), much faster than going through
/// `JSONDecoder` for the untyped `JSONValue`. Nesting deeper than `maxDepth` is refused.
package struct JSONParser {
    package struct Failure: Error, CustomStringConvertible {
        package let message: String
        package let offset: Int
        package var description: String { "\(message) at byte \(offset)" }
    }

    static let maxDepth = 64

    private let bytes: UnsafeBufferPointer<UInt8>
    private var index = 0
    /// A member of the outermost object whose value's exact text is wanted.
    private let recordedMember: String?
    /// Where that member's value lies in `bytes` (the last one, as for its value).
    private var recordedSpan: Range<Int>?
    /// An object naming a member twice is refused (`parseRefusingRepeatedNames`).
    private var refusesRepeatedNames = false

    private init(_ bytes: UnsafeBufferPointer<UInt8>, recording member: String?) {
        self.bytes = bytes
        self.recordedMember = member
    }

    package static func parse(_ text: String) throws(Failure) -> JSONValue {
        try reading(text, recording: nil) { parser, _ throws(Failure) in try parser.value(depth: 0) }
    }

    /// As `parse`, but an object that names a member twice, at any depth, is refused (where
    /// `parse` keeps the last, as most parsers do, and others keep the first): text from
    /// devices, where two readers must not read two values.
    package static func parseRefusingRepeatedNames(_ text: String) throws(Failure) -> JSONValue {
        try reading(text, recording: nil) { parser, _ throws(Failure) in
            parser.refusesRepeatedNames = true
            return try parser.value(depth: 0)
        }
    }

    /// Runs `body` on a parser over `text`'s UTF-8, with whitespace skipped before it, and
    /// checks that only whitespace follows what it read.
    private static func reading<T>(_ text: String, recording member: String?,
                                   _ body: (inout JSONParser, UnsafeBufferPointer<UInt8>) throws(Failure) -> T) throws(Failure) -> T {
        var text = text
        let result: Result<T, Failure> = text.withUTF8 { buffer in
            var parser = JSONParser(buffer, recording: member)
            do {
                parser.skipWhitespace()
                let value = try body(&parser, buffer)
                parser.skipWhitespace()
                guard parser.index == buffer.count else { throw parser.fail("unexpected text after the value") }
                return .success(value)
            } catch let failure as Failure {
                return .failure(failure)
            } catch {
                return .failure(Failure(message: "\(error)", offset: 0))
            }
        }
        return try result.get()
    }

    /// The member names `skim` keeps (at most `KeptStrings.capacity`), prepared once.
    package struct Keys: Sendable {
        package let names: [String]
        fileprivate let bytes: [[UInt8]]

        package init(_ names: [String]) {
            precondition(names.count <= KeptStrings.capacity, "a skim keeps at most \(KeptStrings.capacity) members")
            self.names = names
            self.bytes = names.map { Array($0.utf8) }
        }

        /// The position of the name in `candidate`'s bytes, if it is one of them.
        fileprivate func position(of candidate: UnsafeBufferPointer<UInt8>) -> Int? {
            bytes.firstIndex { $0.count == candidate.count && $0.elementsEqual(candidate) }
        }
    }

    /// The kept members' strings, by the position of their names in `Keys`: stored inline,
    /// so that skimming a message allocates no array for them.
    package struct KeptStrings {
        private typealias Values = InlineArray<8, String?>
        package static var capacity: Int { Values.count }
        private var values = Values(repeating: nil)

        package subscript(position: Int) -> String? {
            get { values[position] }
            set { values[position] = newValue }
        }
    }

    /// What `skim` keeps of a JSON text.
    package struct Skim {
        /// False when the text is valid JSON but not an object.
        package var isObject: Bool
        /// For each of the kept names, the outermost object's member of that name when its
        /// value is a string (the last such member, as in `parse`).
        package var strings: KeptStrings
        /// The exact text of the recorded member's value, and whether it is an object.
        package var memberText: String?
        package var memberIsObject: Bool
        /// A kept or the recorded member was named twice in the outermost object.
        package var repeatsKeptMember = false
    }

    /// Checks `text` exactly as `parse` does (the same errors at the same offsets) but
    /// builds only the outermost object's string members named in `keys`, and the text of
    /// `member`: for a CCS message, everything the worker needs at once, at a fraction of
    /// the cost of building every value.
    package static func skim(_ text: String, keeping keys: Keys, recording member: String) throws(Failure) -> Skim {
        try reading(text, recording: member) { parser, buffer throws(Failure) in
            var skim = Skim(isObject: false, strings: KeptStrings(), memberText: nil, memberIsObject: false)
            if parser.index < buffer.count, buffer[parser.index] == UInt8(ascii: "{") {
                skim.isObject = true
                try parser.outermostStrings(keys, into: &skim.strings, repeated: &skim.repeatsKeptMember)
            } else {
                try parser.skipValue(depth: 0)
            }
            if let span = parser.recordedSpan {
                skim.memberText = String(decoding: UnsafeBufferPointer(rebasing: buffer[span]), as: UTF8.self)
                skim.memberIsObject = buffer[span.lowerBound] == UInt8(ascii: "{")
            }
            return skim
        }
    }

    /// The outermost object, as `object(depth: 1)` reads it, keeping the string members
    /// named in `keys`. Names are compared as bytes; only a name with escapes is decoded.
    private mutating func outermostStrings(_ keys: Keys, into strings: inout KeptStrings, repeated: inout Bool) throws(Failure) {
        var seen = 0
        var recordedSeen = false
        index += 1
        skipWhitespace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "}") {
            index += 1
            return
        }
        while true {
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw fail("expected a member name") }
            let quote = index
            _ = try string(collect: false)
            let raw = UnsafeBufferPointer(rebasing: bytes[(quote + 1)..<(index - 1)])
            var name: String?
            if raw.contains(UInt8(ascii: "\\")) {
                // Rare: read the name again, decoding its escapes (it was checked already).
                let end = index
                index = quote
                name = try string()
                index = end
            }
            let position = name.map { keys.names.firstIndex(of: $0) } ?? keys.position(of: raw)
            let isMember = recordedMember.map { wanted in name.map { $0 == wanted } ?? wanted.utf8.elementsEqual(raw) } ?? false
            if let position {
                if seen & (1 << position) != 0 { repeated = true }
                seen |= 1 << position
            }
            if isMember {
                if recordedSeen { repeated = true }
                recordedSeen = true
            }
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { throw fail("expected ':'") }
            index += 1
            skipWhitespace()
            let start = index
            if index < bytes.count, bytes[index] == UInt8(ascii: "\"") {
                let value = try string(collect: position != nil)
                if let position { strings[position] = value }
            } else {
                if let position { strings[position] = nil }  // a later member wins, as in `parse`
                try skipValue(depth: 1)
            }
            if isMember { recordedSpan = start..<index }
            skipWhitespace()
            guard index < bytes.count else { throw fail("unexpected end of input") }
            if bytes[index] == UInt8(ascii: ",") { index += 1; continue }
            if bytes[index] == UInt8(ascii: "}") { index += 1; return }
            throw fail("expected ',' or '}'")
        }
    }

    /// Moves past a value, checking it as `value(depth:)` does, building nothing.
    private mutating func skipValue(depth: Int) throws(Failure) {
        guard index < bytes.count else { throw fail("unexpected end of input") }
        switch bytes[index] {
        case UInt8(ascii: "{"), UInt8(ascii: "["):
            let closing = bytes[index] == UInt8(ascii: "{") ? UInt8(ascii: "}") : UInt8(ascii: "]")
            guard depth + 1 <= Self.maxDepth else { throw fail("nesting deeper than \(Self.maxDepth)") }
            index += 1
            skipWhitespace()
            if index < bytes.count, bytes[index] == closing {
                index += 1
                return
            }
            while true {
                skipWhitespace()
                if closing == UInt8(ascii: "}") {
                    guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw fail("expected a member name") }
                    _ = try string(collect: false)
                    skipWhitespace()
                    guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { throw fail("expected ':'") }
                    index += 1
                    skipWhitespace()
                }
                try skipValue(depth: depth + 1)
                skipWhitespace()
                guard index < bytes.count else { throw fail("unexpected end of input") }
                if bytes[index] == UInt8(ascii: ",") { index += 1; continue }
                if bytes[index] == closing { index += 1; return }
                throw fail(closing == UInt8(ascii: "}") ? "expected ',' or '}'" : "expected ',' or ']'")
            }
        case UInt8(ascii: "\""): _ = try string(collect: false)
        case UInt8(ascii: "t"): try literal("true")
        case UInt8(ascii: "f"): try literal("false")
        case UInt8(ascii: "n"): try literal("null")
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): try scanNumber()
        default: throw fail("unexpected character")
        }
    }

    private func fail(_ message: String) -> Failure { Failure(message: message, offset: index) }

    private mutating func skipWhitespace() {
        while index < bytes.count {
            switch bytes[index] {
            case 0x20, 0x09, 0x0A, 0x0D: index += 1
            default: return
            }
        }
    }

    private mutating func value(depth: Int) throws(Failure) -> JSONValue {
        guard index < bytes.count else { throw fail("unexpected end of input") }
        switch bytes[index] {
        case UInt8(ascii: "{"): return try object(depth: depth + 1)
        case UInt8(ascii: "["): return try array(depth: depth + 1)
        case UInt8(ascii: "\""): return .string(try string())
        case UInt8(ascii: "t"): try literal("true"); return .bool(true)
        case UInt8(ascii: "f"): try literal("false"); return .bool(false)
        case UInt8(ascii: "n"): try literal("null"); return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return .number(try number())
        default: throw fail("unexpected character")
        }
    }

    private mutating func literal(_ word: StaticString) throws(Failure) {
        let count = word.utf8CodeUnitCount
        guard index + count <= bytes.count else { throw fail("unexpected end of input") }
        for offset in 0..<count where bytes[index + offset] != word.utf8Start[offset] {
            throw fail("invalid literal")
        }
        index += count
    }

    private mutating func object(depth: Int) throws(Failure) -> JSONValue {
        guard depth <= Self.maxDepth else { throw fail("nesting deeper than \(Self.maxDepth)") }
        index += 1
        skipWhitespace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "}") {
            index += 1
            return .object([:])
        }
        // Room for a CCS message's members from the start: growing one member at a time
        // would rehash the table three times. Copied from an empty table of that size on its
        // first insertion: `Dictionary(minimumCapacity:)` is not specialized and looked its
        // storage's type up at run time for every object (about 80 ns of 300).
        var members = Self.emptyMembers
        while true {
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw fail("expected a member name") }
            let nameStart = index
            let key = try string()
            if refusesRepeatedNames && members[key] != nil {
                index = nameStart
                throw fail("the member \(JSONValue.string(String(key.prefix(64))).serialized) is named twice")
            }
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { throw fail("expected ':'") }
            index += 1
            skipWhitespace()
            members[key] = try value(depth: depth)
            skipWhitespace()
            guard index < bytes.count else { throw fail("unexpected end of input") }
            if bytes[index] == UInt8(ascii: ",") { index += 1; continue }
            if bytes[index] == UInt8(ascii: "}") { index += 1; return .object(members) }
            throw fail("expected ',' or '}'")
        }
    }

    /// An empty object's table with room for eight members, copied by each object parsed.
    private static let emptyMembers = [String: JSONValue](minimumCapacity: 8)

    private mutating func array(depth: Int) throws(Failure) -> JSONValue {
        guard depth <= Self.maxDepth else { throw fail("nesting deeper than \(Self.maxDepth)") }
        index += 1
        var elements: [JSONValue] = []
        skipWhitespace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "]") {
            index += 1
            return .array(elements)
        }
        while true {
            skipWhitespace()
            elements.append(try value(depth: depth))
            skipWhitespace()
            guard index < bytes.count else { throw fail("unexpected end of input") }
            if bytes[index] == UInt8(ascii: ",") { index += 1; continue }
            if bytes[index] == UInt8(ascii: "]") { index += 1; return .array(elements) }
            throw fail("expected ',' or ']'")
        }
    }

    private mutating func string() throws(Failure) -> String {
        try string(collect: true)
    }

    /// Reads a string; with `collect` false it is only validated and "" comes back.
    private mutating func string(collect: Bool) throws(Failure) -> String {
        index += 1  // opening quote
        let start = index
        // Fast path: no escapes.
        while index < bytes.count {
            let byte = bytes[index]
            if byte == UInt8(ascii: "\"") {
                let text = collect ? String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self) : ""
                index += 1
                return text
            }
            if byte == UInt8(ascii: "\\") { break }
            if byte < 0x20 { throw fail("control character in a string") }
            index += 1
        }
        var scratch = collect ? Array(bytes[start..<index]) : []
        while index < bytes.count {
            let byte = bytes[index]
            switch byte {
            case UInt8(ascii: "\""):
                index += 1
                return collect ? String(decoding: scratch, as: UTF8.self) : ""
            case UInt8(ascii: "\\"):
                index += 1
                guard index < bytes.count else { throw fail("unexpected end of input") }
                let escape = bytes[index]
                index += 1
                let decoded: UInt8
                switch escape {
                case UInt8(ascii: "\""): decoded = 0x22
                case UInt8(ascii: "\\"): decoded = 0x5C
                case UInt8(ascii: "/"): decoded = 0x2F
                case UInt8(ascii: "b"): decoded = 0x08
                case UInt8(ascii: "f"): decoded = 0x0C
                case UInt8(ascii: "n"): decoded = 0x0A
                case UInt8(ascii: "r"): decoded = 0x0D
                case UInt8(ascii: "t"): decoded = 0x09
                case UInt8(ascii: "u"):
                    var scalar = try hex4()
                    if (0xD800...0xDBFF).contains(scalar) {
                        guard index + 1 < bytes.count, bytes[index] == UInt8(ascii: "\\"), bytes[index + 1] == UInt8(ascii: "u") else {
                            throw fail("unpaired surrogate")
                        }
                        index += 2
                        let low = try hex4()
                        guard (0xDC00...0xDFFF).contains(low) else { throw fail("unpaired surrogate") }
                        scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                    } else if (0xDC00...0xDFFF).contains(scalar) {
                        throw fail("unpaired surrogate")
                    }
                    if collect { scratch.append(contentsOf: Array(String(Unicode.Scalar(scalar)!).utf8)) }
                    continue
                default:
                    throw fail("invalid escape")
                }
                if collect { scratch.append(decoded) }
            default:
                if byte < 0x20 { throw fail("control character in a string") }
                if collect { scratch.append(byte) }
                index += 1
            }
        }
        throw fail("unterminated string")
    }

    private mutating func hex4() throws(Failure) -> UInt32 {
        guard index + 4 <= bytes.count else { throw fail("unexpected end of input") }
        var value: UInt32 = 0
        for _ in 0..<4 {
            let byte = bytes[index]
            let digit: UInt32
            switch byte {
            case 48...57: digit = UInt32(byte - 48)
            case 97...102: digit = UInt32(byte - 87)
            case 65...70: digit = UInt32(byte - 55)
            default: throw fail("invalid \\u escape")
            }
            value = value << 4 | digit
            index += 1
        }
        return value
    }

    private mutating func number() throws(Failure) -> JSONNumber {
        let start = index
        try scanNumber()
        return JSONNumber(validated: String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self))
    }

    /// Moves past a number, checking its syntax.
    private mutating func scanNumber() throws(Failure) {
        if bytes[index] == UInt8(ascii: "-") { index += 1 }
        guard index < bytes.count else { throw fail("invalid number") }
        if bytes[index] == UInt8(ascii: "0") {
            index += 1
        } else {
            guard (49...57).contains(bytes[index]) else { throw fail("invalid number") }
            while index < bytes.count, (48...57).contains(bytes[index]) { index += 1 }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            index += 1
            guard index < bytes.count, (48...57).contains(bytes[index]) else { throw fail("invalid number") }
            while index < bytes.count, (48...57).contains(bytes[index]) { index += 1 }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
            index += 1
            if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") { index += 1 }
            guard index < bytes.count, (48...57).contains(bytes[index]) else { throw fail("invalid number") }
            while index < bytes.count, (48...57).contains(bytes[index]) { index += 1 }
        }
    }
}
