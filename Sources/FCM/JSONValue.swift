import Foundation

/// Any JSON value, Sendable, for payloads whose shape the worker does not fix
/// (`data`, `notification`, unknown fields).
public enum JSONValue: Sendable, Equatable, Codable, CustomStringConvertible {
    case string(String)
    /// A number, kept as its text (see `JSONNumber`).
    case number(JSONNumber)
    case bool(Bool)
    case null
    case array([JSONValue])
    case object([String: JSONValue])

    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() { self = .null }
        else if let value = try? container.decode(Bool.self) { self = .bool(value) }
        else if let value = try? container.decode(Int.self) { self = .number(JSONNumber(value)) }
        else if let value = try? container.decode(Double.self) { self = .number(JSONNumber(value)) }
        else if let value = try? container.decode(String.self) { self = .string(value) }
        else if let value = try? container.decode([JSONValue].self) { self = .array(value) }
        else { self = .object(try container.decode([String: JSONValue].self)) }
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .string(let value): try container.encode(value)
        case .number(let value):
            if let whole = value.int64Value { try container.encode(whole) } else { try container.encode(value.doubleValue) }
        case .bool(let value): try container.encode(value)
        case .null: try container.encodeNil()
        case .array(let value): try container.encode(value)
        case .object(let value): try container.encode(value)
        }
    }

    /// Parses JSON text (strict RFC 8259, nesting up to 64 levels).
    /// - Throws: an error naming the problem and its byte offset.
    public static func parse(_ text: String) throws -> JSONValue {
        try JSONParser.parse(text)
    }

    /// The member `key` of an object.
    public subscript(key: String) -> JSONValue? {
        if case .object(let members) = self { return members[key] }
        return nil
    }

    public var stringValue: String? {
        if case .string(let value) = self { return value }
        return nil
    }

    public var arrayValue: [JSONValue]? {
        if case .array(let value) = self { return value }
        return nil
    }

    public var objectValue: [String: JSONValue]? {
        if case .object(let value) = self { return value }
        return nil
    }

    /// Compact JSON text with keys sorted (stable output for logs and tests).
    public var serialized: String {
        var output = ""
        write(to: &output)
        return output
    }

    public var description: String { serialized }

    /// Compact JSON text as UTF-8, with keys in no particular order: for the wire, where
    /// sorting every object's keys would cost for nothing.
    public var wireBytes: [UInt8] {
        var output: [UInt8] = []
        output.reserveCapacity(256)
        writeUnsorted(to: &output)
        return output
    }

    /// Appends the compact JSON text as UTF-8, keys in no particular order (straight into
    /// bytes: no String is grown piece by piece).
    public func writeUnsorted(to output: inout [UInt8]) {
        switch self {
        case .string(let value):
            JSONValue.appendQuoted(value, to: &output)
        case .number(let value):
            output.append(contentsOf: value.text.utf8)
        case .bool(let value):
            output.append(contentsOf: value ? "true".utf8 : "false".utf8)
        case .null:
            output.append(contentsOf: "null".utf8)
        case .array(let values):
            output.append(UInt8(ascii: "["))
            for (index, value) in values.enumerated() {
                if index > 0 { output.append(UInt8(ascii: ",")) }
                value.writeUnsorted(to: &output)
            }
            output.append(UInt8(ascii: "]"))
        case .object(let members):
            output.append(UInt8(ascii: "{"))
            var first = true
            for (key, value) in members {
                if !first { output.append(UInt8(ascii: ",")) }
                first = false
                JSONValue.appendQuoted(key, to: &output)
                output.append(UInt8(ascii: ":"))
                value.writeUnsorted(to: &output)
            }
            output.append(UInt8(ascii: "}"))
        }
    }

    /// Appends `text` as a JSON string literal in UTF-8: quotes, backslashes and control
    /// characters escaped, everything else as is.
    public static func appendQuoted(_ text: String, to output: inout [UInt8]) {
        output.append(UInt8(ascii: "\""))
        var scanned = text
        scanned.withUTF8 { bytes in
            var plainFrom = 0
            for (index, byte) in bytes.enumerated() where byte < 0x20 || byte == 0x22 || byte == 0x5C {
                output.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[plainFrom..<index]))
                plainFrom = index + 1
                output.append(UInt8(ascii: "\\"))
                switch byte {
                case 0x22: output.append(UInt8(ascii: "\""))
                case 0x5C: output.append(UInt8(ascii: "\\"))
                case 0x0A: output.append(UInt8(ascii: "n"))
                case 0x0D: output.append(UInt8(ascii: "r"))
                case 0x09: output.append(UInt8(ascii: "t"))
                default:
                    let hex = Array("0123456789abcdef".utf8)
                    output.append(contentsOf: [UInt8(ascii: "u"), UInt8(ascii: "0"), UInt8(ascii: "0"), hex[Int(byte >> 4)], hex[Int(byte & 0xF)]])
                }
            }
            output.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[plainFrom...]))
        }
        output.append(UInt8(ascii: "\""))
    }

    func write(to output: inout String) {
        switch self {
        case .string(let value): JSONValue.appendQuoted(value, to: &output)
        case .number(let value): output += value.text
        case .bool(let value): output += value ? "true" : "false"
        case .null: output += "null"
        case .array(let values):
            output += "["
            for (index, value) in values.enumerated() {
                if index > 0 { output += "," }
                value.write(to: &output)
            }
            output += "]"
        case .object(let members):
            output += "{"
            for (index, key) in members.keys.sorted().enumerated() {
                if index > 0 { output += "," }
                JSONValue.appendQuoted(key, to: &output)
                output += ":"
                members[key]!.write(to: &output)
            }
            output += "}"
        }
    }

    /// Appends `text` as a JSON string literal.
    public static func appendQuoted(_ text: String, to output: inout String) {
        var scanned = text
        let plain = scanned.withUTF8 { bytes in
            for byte in bytes where byte < 0x20 || byte == 0x22 || byte == 0x5C { return false }
            return true
        }
        if plain {
            output += "\""
            output += text
            output += "\""
            return
        }
        // Escapes are rare: written by the byte version, so that both escape alike.
        var escaped: [UInt8] = []
        appendQuoted(text, to: &escaped)
        output += String(decoding: escaped, as: UTF8.self)
    }
}
