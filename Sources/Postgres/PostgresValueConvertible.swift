import Foundation

/// A Swift value that is a statement parameter: `String`, the integer types, `Double`,
/// `Float`, `Bool`, `Date` (`timestamptz`), `Data` (`bytea`),
/// `UUID` (as text: cast `$1::uuid` for a uuid column), arrays of these (a PostgreSQL array),
/// optionals (NULL), and `PostgresValue` itself. Any `Encodable` goes in as `jsonb` with
/// `PostgresValue.json(_:)`.
public protocol PostgresValueConvertible {
    var postgresValue: PostgresValue { get }
}

extension PostgresValue: PostgresValueConvertible {
    public var postgresValue: PostgresValue { self }

    /// A Swift value as a parameter.
    public init(_ value: some PostgresValueConvertible) {
        self = value.postgresValue
    }

    /// `value` encoded as JSON (with `JSONEncoder`: dates as ISO 8601, keys sorted), for a
    /// `jsonb` or `json` parameter (`$1::jsonb`).
    /// - Throws: the encoder's error for a value JSON cannot hold (a NaN, say).
    public static func json(_ value: some Encodable) throws -> PostgresValue {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return .jsonb(String(decoding: try encoder.encode(value), as: UTF8.self))
    }
}

extension String: PostgresValueConvertible {
    public var postgresValue: PostgresValue { .text(self) }
}

extension Substring: PostgresValueConvertible {
    public var postgresValue: PostgresValue { .text(String(self)) }
}

extension Int: PostgresValueConvertible {
    public var postgresValue: PostgresValue { .int(Int64(self)) }
}

extension Int64: PostgresValueConvertible {
    public var postgresValue: PostgresValue { .int(self) }
}

extension Int32: PostgresValueConvertible {
    public var postgresValue: PostgresValue { .int(Int64(self)) }
}

extension Int16: PostgresValueConvertible {
    public var postgresValue: PostgresValue { .int(Int64(self)) }
}

extension Double: PostgresValueConvertible {
    public var postgresValue: PostgresValue { .double(self) }
}

extension Float: PostgresValueConvertible {
    public var postgresValue: PostgresValue { .double(Double(self)) }
}

extension Bool: PostgresValueConvertible {
    public var postgresValue: PostgresValue { .bool(self) }
}

extension Date: PostgresValueConvertible {
    public var postgresValue: PostgresValue { .timestamptz(self) }
}

extension Data: PostgresValueConvertible {
    public var postgresValue: PostgresValue { .bytea(Array(self)) }
}

extension UUID: PostgresValueConvertible {
    /// Lower-case text, as PostgreSQL prints a `uuid`.
    public var postgresValue: PostgresValue { .text(uuidString.lowercased()) }
}

extension Optional: PostgresValueConvertible where Wrapped: PostgresValueConvertible {
    public var postgresValue: PostgresValue { map(\.postgresValue) ?? .null }
}

extension Array: PostgresValueConvertible where Element: PostgresValueConvertible {
    /// A one-dimensional PostgreSQL array (cast it: `$1::text[]`, `$1::bigint[]`).
    public var postgresValue: PostgresValue { .array(map(\.postgresValue)) }
}
