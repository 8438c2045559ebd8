/// Reads the top-level string members of a JSON object fed to it in pieces, without keeping
/// the text: what the worker can still learn of a stanza too large to keep (its
/// `message_id` and `from`, to ack it and set it aside). Nested objects and arrays are
/// passed over, whatever they hold; a value longer than `maximumValueBytes` is left out.
/// It never fails: text that is not JSON yields fewer members.
public struct JSONMemberScanner: Sendable {
    /// The longest value kept, in bytes of its JSON text.
    public let maximumValueBytes: Int
    /// The most members kept.
    public let maximumMembers: Int
    /// The top-level members whose values are strings, each the first of its name.
    public private(set) var members: [String: String] = [:]

    private enum Role { case other, key, value }
    private var depth = 0
    private var inString = false
    private var escaped = false
    private var role = Role.other
    private var expectingKey = false
    private var expectingValue = false
    private var key: [UInt8]?
    private var buffer: [UInt8] = []
    private var overflowed = false

    public init(maximumValueBytes: Int = 64 << 10, maximumMembers: Int = 16) {
        self.maximumValueBytes = maximumValueBytes
        self.maximumMembers = maximumMembers
    }

    /// Reads the next bytes of the text.
    public mutating func feed(_ bytes: UnsafeRawBufferPointer) {
        for byte in bytes { feed(byte) }
    }

    private mutating func feed(_ byte: UInt8) {
        if inString {
            if escaped {
                escaped = false
                keep(byte)
            } else if byte == 0x5C {  // \
                escaped = true
                keep(byte)
            } else if byte == 0x22 {  // "
                inString = false
                finishString()
            } else {
                keep(byte)
            }
            return
        }
        switch byte {
        case 0x22:
            inString = true
            buffer.removeAll(keepingCapacity: true)
            overflowed = false
            if depth == 1 && expectingKey {
                role = .key
                expectingKey = false
            } else if depth == 1 && expectingValue {
                role = .value
                expectingValue = false
            } else {
                role = .other
            }
        case 0x7B, 0x5B:  // { [
            if depth == 1 && expectingValue { passValue() }
            depth += 1
            if depth == 1 && byte == 0x7B { expectingKey = true }
        case 0x7D, 0x5D:  // } ]
            depth = max(0, depth - 1)
        case 0x3A:  // :
            if depth == 1 && key != nil { expectingValue = true }
        case 0x2C:  // ,
            if depth == 1 {
                expectingKey = true
                passValue()
            }
        case 0x20, 0x09, 0x0A, 0x0D:
            break
        default:
            // A number, true, false or null.
            if depth == 1 && expectingValue { passValue() }
        }
    }

    private mutating func keep(_ byte: UInt8) {
        guard role != .other, !overflowed else { return }
        if buffer.count >= (role == .key ? 256 : maximumValueBytes) {
            overflowed = true
            return
        }
        buffer.append(byte)
    }

    private mutating func finishString() {
        switch role {
        case .key:
            key = overflowed ? nil : buffer
        case .value:
            if let key, !overflowed, members.count < maximumMembers {
                let name = Self.decode(key)
                if members[name] == nil { members[name] = Self.decode(buffer) }
            }
            key = nil
        case .other:
            break
        }
        role = .other
    }

    /// A value that is not a string: its member is passed over.
    private mutating func passValue() {
        expectingValue = false
        key = nil
    }

    /// The text of a JSON string's contents (escapes resolved; a bad escape kept as it is).
    static func decode(_ raw: [UInt8]) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(raw.count)
        var index = 0
        func hex(_ at: Int) -> UInt32? {
            guard at + 4 <= raw.count else { return nil }
            var value: UInt32 = 0
            for byte in raw[at..<at + 4] {
                let digit: UInt32
                switch byte {
                case 0x30...0x39: digit = UInt32(byte - 0x30)
                case 0x41...0x46: digit = UInt32(byte - 0x41 + 10)
                case 0x61...0x66: digit = UInt32(byte - 0x61 + 10)
                default: return nil
                }
                value = value * 16 + digit
            }
            return value
        }
        while index < raw.count {
            let byte = raw[index]
            guard byte == 0x5C, index + 1 < raw.count else {
                out.append(byte)
                index += 1
                continue
            }
            let next = raw[index + 1]
            switch next {
            case 0x22, 0x5C, 0x2F: out.append(next)
            case 0x62: out.append(0x08)
            case 0x66: out.append(0x0C)
            case 0x6E: out.append(0x0A)
            case 0x72: out.append(0x0D)
            case 0x74: out.append(0x09)
            case 0x75:
                guard var scalar = hex(index + 2) else {
                    out.append(contentsOf: raw[index...index + 1])
                    index += 2
                    continue
                }
                index += 6
                if (0xD800...0xDBFF).contains(scalar), index + 1 < raw.count, raw[index] == 0x5C, raw[index + 1] == 0x75,
                   let low = hex(index + 2), (0xDC00...0xDFFF).contains(low) {
                    scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                    index += 6
                }
                out.append(contentsOf: String(Character(Unicode.Scalar(scalar) ?? "\u{FFFD}")).utf8)
                continue
            default:
                out.append(contentsOf: raw[index...index + 1])
            }
            index += 2
        }
        return String(decoding: out, as: UTF8.self)
    }
}
