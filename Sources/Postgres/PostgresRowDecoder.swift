import Foundation

extension PostgresRow {
    /// The row as a `Decodable` value, its properties matched to columns by name (alias
    /// columns in SQL, `AS chat_id`, or give the type `CodingKeys`).
    ///
    /// Each column's text becomes the property's type: `String`, integers, `Double`,
    /// `Float`, `Decimal`, `Bool`, `Date` (`timestamptz`), `Data` (`bytea`), `UUID`, `URL`;
    /// an array from a PostgreSQL array (`{a,b}`) or a JSON array; anything else `Decodable`
    /// from the column's JSON (`jsonb`). An optional property is nil for NULL or a missing column.
    /// - Throws: `DecodingError` naming the column and what its text could not be.
    public func decode<Row: Decodable>(_ type: Row.Type = Row.self) throws -> Row {
        try Row(from: PostgresRowDecoder(row: self))
    }
}

/// Decodes one row: a keyed container over its columns.
struct PostgresRowDecoder: Decoder {
    let row: PostgresRow
    var codingPath: [any CodingKey] { [] }
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        KeyedDecodingContainer(Columns(row: row))
    }

    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        throw DecodingError.typeMismatch([Any].self, .init(codingPath: [], debugDescription: "a row decodes into a keyed type (a struct)"))
    }

    func singleValueContainer() throws -> any SingleValueDecodingContainer {
        guard row.values.count == 1 else {
            throw DecodingError.typeMismatch(Any.self, .init(codingPath: [], debugDescription: "a row of \(row.values.count) columns decodes into a struct"))
        }
        return PostgresCellDecoder(text: row.values[0], codingPath: [])
    }

    struct Columns<Key: CodingKey>: KeyedDecodingContainerProtocol {
        let row: PostgresRow
        var codingPath: [any CodingKey] { [] }
        var allKeys: [Key] { row.columns.compactMap { Key(stringValue: $0) } }

        func contains(_ key: Key) -> Bool { row.index(of: key.stringValue) != nil }

        func decodeNil(forKey key: Key) throws -> Bool {
            row.index(of: key.stringValue).map { row.values[$0] == nil } ?? true
        }

        func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T {
            guard let index = row.index(of: key.stringValue) else {
                throw DecodingError.keyNotFound(key, .init(codingPath: [key], debugDescription: "the row has no column \(key.stringValue) (columns: \(row.columns.joined(separator: ", ")))"))
            }
            return try PostgresCellDecoder(text: row.values[index], codingPath: [key]).decode(type)
        }

        func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws -> KeyedDecodingContainer<NestedKey> {
            throw DecodingError.typeMismatch(type, .init(codingPath: [key], debugDescription: "a column decodes as a value, not a nested container"))
        }

        func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
            throw DecodingError.typeMismatch([Any].self, .init(codingPath: [key], debugDescription: "a column decodes as a value, not a nested container"))
        }

        func superDecoder() throws -> any Decoder { PostgresRowDecoder(row: row) }
        func superDecoder(forKey key: Key) throws -> any Decoder { PostgresRowDecoder(row: row) }
    }
}

/// Decodes one column's text (nil for NULL) into a Swift type.
struct PostgresCellDecoder: SingleValueDecodingContainer {
    let text: String?
    let codingPath: [any CodingKey]

    func decodeNil() -> Bool { text == nil }

    func decode<T: Decodable>(_ type: T.Type) throws -> T { try decodeValue(type) }
    func decode(_ type: Bool.Type) throws -> Bool { try decodeValue(type) }
    func decode(_ type: String.Type) throws -> String { try decodeValue(type) }
    func decode(_ type: Double.Type) throws -> Double { try decodeValue(type) }
    func decode(_ type: Float.Type) throws -> Float { try decodeValue(type) }
    func decode(_ type: Int.Type) throws -> Int { try decodeValue(type) }
    func decode(_ type: Int8.Type) throws -> Int8 { try decodeValue(type) }
    func decode(_ type: Int16.Type) throws -> Int16 { try decodeValue(type) }
    func decode(_ type: Int32.Type) throws -> Int32 { try decodeValue(type) }
    func decode(_ type: Int64.Type) throws -> Int64 { try decodeValue(type) }
    func decode(_ type: UInt.Type) throws -> UInt { try decodeValue(type) }
    func decode(_ type: UInt8.Type) throws -> UInt8 { try decodeValue(type) }
    func decode(_ type: UInt16.Type) throws -> UInt16 { try decodeValue(type) }
    func decode(_ type: UInt32.Type) throws -> UInt32 { try decodeValue(type) }
    func decode(_ type: UInt64.Type) throws -> UInt64 { try decodeValue(type) }

    private func decodeValue<T: Decodable>(_ type: T.Type) throws -> T {
        guard let text else {
            throw DecodingError.valueNotFound(type, .init(codingPath: codingPath, debugDescription: "\(columnName) is NULL"))
        }
        if let value = try primitive(type, text) { return value }
        if let arrayType = type as? any PostgresArrayDecodable.Type, text.hasPrefix("{"),
           let elements = PostgresRow.parseArrayElements(text) {
            return try arrayType.decodeElements(elements, codingPath: codingPath) as! T
        }
        do {
            let decoder = JSONDecoder()
            decoder.dateDecodingStrategy = .iso8601
            return try decoder.decode(type, from: Data(text.utf8))
        } catch {
            throw DecodingError.dataCorrupted(.init(codingPath: codingPath, debugDescription: "\(columnName) is not \(type) (nor JSON for it): \(text.prefix(60))", underlyingError: error))
        }
    }

    private var columnName: String { codingPath.last.map { "column \($0.stringValue)" } ?? "the value" }

    /// The value for the scalar types, nil for other types.
    private func primitive<T>(_ type: T.Type, _ text: String) throws -> T? {
        func parsed<V>(_ value: V?) throws -> T {
            guard let value else {
                throw DecodingError.dataCorrupted(.init(codingPath: codingPath, debugDescription: "\(columnName) is not \(type): \(text.prefix(60))"))
            }
            return value as! T
        }
        switch type {
        case is String.Type: return text as? T
        case is Int.Type: return try parsed(Int(text))
        case is Int64.Type: return try parsed(Int64(text))
        case is Int32.Type: return try parsed(Int32(text))
        case is Int16.Type: return try parsed(Int16(text))
        case is Int8.Type: return try parsed(Int8(text))
        case is UInt.Type: return try parsed(UInt(text))
        case is UInt64.Type: return try parsed(UInt64(text))
        case is UInt32.Type: return try parsed(UInt32(text))
        case is UInt16.Type: return try parsed(UInt16(text))
        case is UInt8.Type: return try parsed(UInt8(text))
        case is Double.Type: return try parsed(Self.double(text))
        case is Float.Type: return try parsed(Self.double(text).map(Float.init))
        case is Decimal.Type: return try parsed(Decimal(string: text, locale: Locale(identifier: "en_US_POSIX")))
        case is Bool.Type: return try parsed(["t": true, "true": true, "f": false, "false": false][text])
        case is Date.Type: return try parsed(PostgresTimestamp.parse(text))
        case is Data.Type: return try parsed(PostgresRow.parseBytea(text).map { Data($0) })
        case is UUID.Type: return try parsed(UUID(uuidString: text))
        case is URL.Type: return try parsed(URL(string: text))
        default: return nil
        }
    }

    private static func double(_ text: String) -> Double? {
        switch text {
        case "NaN": .nan
        case "Infinity": .infinity
        case "-Infinity": -.infinity
        default: Double(text)
        }
    }
}

/// Arrays decode from PostgreSQL's array text, element by element.
protocol PostgresArrayDecodable {
    static func decodeElements(_ elements: [String?], codingPath: [any CodingKey]) throws -> Self
}

extension Array: PostgresArrayDecodable where Element: Decodable {
    static func decodeElements(_ elements: [String?], codingPath: [any CodingKey]) throws -> [Element] {
        try elements.map { try PostgresCellDecoder(text: $0, codingPath: codingPath).decodeElement(Element.self) }
    }
}

extension PostgresCellDecoder {
    /// An array element: NULL becomes nil for an optional element type.
    func decodeElement<T: Decodable>(_ type: T.Type) throws -> T {
        if text == nil, let optional = type as? any ExpressibleByNilLiteral.Type {
            return optional.init(nilLiteral: ()) as! T
        }
        return try decode(type)
    }
}
