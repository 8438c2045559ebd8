import Foundation

/// Literals: `["status": "ok", "count": 3, "tags": ["a", "b"], "seen": true, "note": nil]`.
extension JSONValue: ExpressibleByStringLiteral, ExpressibleByIntegerLiteral, ExpressibleByFloatLiteral,
    ExpressibleByBooleanLiteral, ExpressibleByNilLiteral, ExpressibleByArrayLiteral, ExpressibleByDictionaryLiteral {
    public init(stringLiteral value: String) { self = .string(value) }
    public init(integerLiteral value: Int) { self = .number(JSONNumber(value)) }
    public init(floatLiteral value: Double) { self = .number(JSONNumber(value)) }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    public init(nilLiteral: ()) { self = .null }
    public init(arrayLiteral elements: JSONValue...) { self = .array(elements) }
    public init(dictionaryLiteral elements: (String, JSONValue)...) {
        self = .object(Dictionary(elements, uniquingKeysWith: { _, last in last }))
    }
}

/// Values from Swift's: `JSONValue(count)`, `JSONValue(name)`.
extension JSONValue {
    public init(_ value: String) { self = .string(value) }
    public init(_ value: Int) { self = .number(JSONNumber(value)) }
    public init(_ value: Double) { self = .number(JSONNumber(value)) }
    public init(_ value: Bool) { self = .bool(value) }
}

/// Bridging to and from `Codable` types.
extension JSONValue {
    /// `value` as JSON (through `JSONEncoder`: dates as ISO 8601).
    /// - Throws: the encoder's error (a NaN, say).
    public init(encoding value: some Encodable) throws {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        self = try JSONValue.parse(String(decoding: try encoder.encode(value), as: UTF8.self))
    }

    /// This value decoded as `type` (through `JSONDecoder`: dates as ISO 8601).
    /// - Throws: `DecodingError` naming what does not fit.
    public func decode<T: Decodable>(_ type: T.Type = T.self) throws -> T {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return try decoder.decode(type, from: Data(serialized.utf8))
    }

    /// A number's value, when it is one.
    public var doubleValue: Double? {
        if case .number(let number) = self { return number.doubleValue }
        return nil
    }

    /// A whole number's value, when it is one.
    public var intValue: Int? {
        if case .number(let number) = self { return number.int64Value.map { Int($0) } }
        return nil
    }

    public var boolValue: Bool? {
        if case .bool(let value) = self { return value }
        return nil
    }
}
