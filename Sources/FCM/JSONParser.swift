/// A strict JSON parser over UTF-8 bytes (RFC 8259), much faster than going through
/// `JSONDecoder` for the untyped `JSONValue`. Nesting deeper than `maxDepth` is refused.
struct JSONParser {
    struct Failure: Error, CustomStringConvertible {
        let message: String
        let offset: Int
        var description: String { "\(message) at byte \(offset)" }
    }

    static let maxDepth = 64

    private let bytes: UnsafeBufferPointer<UInt8>
    private var index = 0
    /// A member of the outermost object whose value's exact text is wanted.
    private let recordedMember: String?
    /// Where that member's value lies in `bytes` (the last one, as for its value).
    private var recordedSpan: Range<Int>?

    private init(_ bytes: UnsafeBufferPointer<UInt8>, recording member: String?) {
        self.bytes = bytes
        self.recordedMember = member
    }

    static func parse(_ text: String) throws(Failure) -> JSONValue {
        try parse(text, recording: nil).value
    }

    /// Parses `text` and also returns the exact text of the value of `member` in the
    /// outermost object (nil when there is no such member), as it was written: numbers
    /// keep every digit and members their order.
    static func parse(_ text: String, recording member: String?) throws(Failure) -> (value: JSONValue, memberText: String?) {
        var text = text
        let result: Result<(JSONValue, String?), Failure> = text.withUTF8 { buffer in
            var parser = JSONParser(buffer, recording: member)
            do {
                parser.skipWhitespace()
                let value = try parser.value(depth: 0)
                parser.skipWhitespace()
                guard parser.index == buffer.count else { throw parser.fail("unexpected text after the value") }
                let memberText = parser.recordedSpan.map { String(decoding: UnsafeBufferPointer(rebasing: buffer[$0]), as: UTF8.self) }
                return .success((value, memberText))
            } catch let failure as Failure {
                return .failure(failure)
            } catch {
                return .failure(Failure(message: "\(error)", offset: 0))
            }
        }
        return try result.get()
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
        // would rehash the table three times.
        var members = [String: JSONValue](minimumCapacity: 8)
        while true {
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw fail("expected a member name") }
            let key = try string()
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { throw fail("expected ':'") }
            index += 1
            skipWhitespace()
            if depth == 1, let recordedMember, key == recordedMember {
                let start = index
                members[key] = try value(depth: depth)
                recordedSpan = start..<index
            } else {
                members[key] = try value(depth: depth)
            }
            skipWhitespace()
            guard index < bytes.count else { throw fail("unexpected end of input") }
            if bytes[index] == UInt8(ascii: ",") { index += 1; continue }
            if bytes[index] == UInt8(ascii: "}") { index += 1; return .object(members) }
            throw fail("expected ',' or '}'")
        }
    }

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
        index += 1  // opening quote
        let start = index
        // Fast path: no escapes.
        while index < bytes.count {
            let byte = bytes[index]
            if byte == UInt8(ascii: "\"") {
                let text = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self)
                index += 1
                return text
            }
            if byte == UInt8(ascii: "\\") { break }
            if byte < 0x20 { throw fail("control character in a string") }
            index += 1
        }
        var scratch = Array(bytes[start..<index])
        while index < bytes.count {
            let byte = bytes[index]
            switch byte {
            case UInt8(ascii: "\""):
                index += 1
                return String(decoding: scratch, as: UTF8.self)
            case UInt8(ascii: "\\"):
                index += 1
                guard index < bytes.count else { throw fail("unexpected end of input") }
                let escape = bytes[index]
                index += 1
                switch escape {
                case UInt8(ascii: "\""): scratch.append(0x22)
                case UInt8(ascii: "\\"): scratch.append(0x5C)
                case UInt8(ascii: "/"): scratch.append(0x2F)
                case UInt8(ascii: "b"): scratch.append(0x08)
                case UInt8(ascii: "f"): scratch.append(0x0C)
                case UInt8(ascii: "n"): scratch.append(0x0A)
                case UInt8(ascii: "r"): scratch.append(0x0D)
                case UInt8(ascii: "t"): scratch.append(0x09)
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
                    scratch.append(contentsOf: Array(String(Unicode.Scalar(scalar)!).utf8))
                default:
                    throw fail("invalid escape")
                }
            default:
                if byte < 0x20 { throw fail("control character in a string") }
                scratch.append(byte)
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

    private mutating func number() throws(Failure) -> Double {
        let start = index
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
        let text = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self)
        guard let value = Double(text) else { throw fail("invalid number") }
        return value
    }
}
