import Foundation
import Runtime

/// A statement parameter. Values travel separately from the SQL text (never spliced into
/// it), in PostgreSQL's text format; cast in SQL where the type is not obvious
/// (`$1::jsonb`, `$2::text[]`).
public enum PostgresValue: Sendable, Equatable {
    case null
    case text(String)
    case int(Int64)
    case bool(Bool)
    case double(Double)
    case bytea([UInt8])
    /// JSON text for a `jsonb` or `json` parameter.
    case jsonb(String)
    case timestamptz(Date)
    /// A one-dimensional array (for `unnest($1::text[])` and friends).
    case array([PostgresValue])

    /// The text-format encoding, nil for SQL NULL.
    public var textEncoding: String? {
        switch self {
        case .null: nil
        case .text(let value), .jsonb(let value): value
        case .int(let value): String(value)
        case .bool(let value): value ? "t" : "f"
        case .double(let value): value.isNaN ? "NaN" : value == .infinity ? "Infinity" : value == -.infinity ? "-Infinity" : "\(value)"
        case .bytea(let bytes): "\\x" + bytes.map { String(format: "%02x", $0) }.joined()
        case .timestamptz(let date): PostgresTimestamp.format(date)
        case .array(let values): Self.arrayLiteral(values)
        }
    }

    /// The value as an SQL literal, for a statement that must do without parameters (one
    /// that goes in a simple query with a COPY, see `PostgresStatement.copy`): `NULL`, or the
    /// text encoding between dollar quotes whose tag the text does not contain, so that no
    /// character in it means anything to the parser (whatever `standard_conforming_strings`
    /// says). Cast it in SQL (`… ::text[]`). Text holding U+0000 makes its statement fail
    /// before it is sent, as such a parameter does (PostgreSQL's text holds none).
    public var sqlLiteral: String {
        guard var text = textEncoding else { return "NULL" }
        let holdsDollar = text.withUTF8 { bytes in
            bytes.baseAddress.map { memchr($0, Int32(UInt8(ascii: "$")), bytes.count) != nil } ?? false
        }
        if !holdsDollar {
            // Sized once (a batch's ids are a few kilobytes).
            var literal = ""
            literal.reserveCapacity(text.utf8.count + 10)
            literal += "$fcm$"
            literal += text
            literal += "$fcm$"
            return literal
        }
        var tag = "$fcm$"
        var number = 0
        // The closing tag must first appear where it is put: a text that ends as a tag
        // begins ("…$fcm") would close the quote early, so the tag's own start counts too.
        while Self.utf8(of: text + tag.dropLast(), contains: tag) {
            number += 1
            tag = "$fcm\(number)$"
        }
        return tag + text + tag
    }

    /// A byte search: `String.contains` with Foundation imported goes through `NSString`'s
    /// locale-aware search, which took about 5 % of the worker's task CPU per upstream
    /// message as it quoted each batch's ids (perf, `bench upstream --phases immediate`).
    private static func utf8(of text: String, contains tag: String) -> Bool {
        text.utf8.firstRange(of: tag.utf8) != nil
    }

    private static func arrayLiteral(_ values: [PostgresValue]) -> String {
        var literal: [UInt8] = [UInt8(ascii: "{")]
        literal.reserveCapacity(values.count * 24)
        for (index, value) in values.enumerated() {
            if index > 0 { literal.append(UInt8(ascii: ",")) }
            // An integer needs neither quotes nor a String of its own (arrays of ids are
            // most of what the outbox's write-back sends).
            if case .int(let number) = value {
                appendDecimal(number, to: &literal)
            } else if let text = value.textEncoding {
                appendQuotedElement(text, to: &literal)
            } else {
                literal.append(contentsOf: "NULL".utf8)
            }
        }
        literal.append(UInt8(ascii: "}"))
        return String(decoding: literal, as: UTF8.self)
    }

    /// Appends `text` as a quoted array element: a quote or backslash gets a backslash before
    /// it; the runs between them (usually the whole text) are copied whole, found with
    /// `memchr` rather than a look at every byte.
    private static func appendQuotedElement(_ text: String, to literal: inout [UInt8]) {
        literal.append(UInt8(ascii: "\""))
        var text = text
        text.withUTF8 { bytes in
            var start = 0
            var searchFrom = 0
            while let special = firstQuoteOrBackslash(in: bytes, from: searchFrom) {
                literal.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[start..<special]))
                literal.append(UInt8(ascii: "\\"))
                // The quote or backslash itself starts the next run.
                start = special
                searchFrom = special + 1
            }
            literal.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[start...]))
        }
        literal.append(UInt8(ascii: "\""))
    }

    /// The offset of the first `"` or `\` in `bytes` at or after `start`.
    private static func firstQuoteOrBackslash(in bytes: UnsafeBufferPointer<UInt8>, from start: Int) -> Int? {
        guard let base = bytes.baseAddress, start < bytes.count else { return nil }
        let count = bytes.count - start
        let quote = memchr(base + start, Int32(UInt8(ascii: "\"")), count).map { UnsafeRawPointer(base).distance(to: UnsafeRawPointer($0)) }
        // A backslash counts only before the quote.
        let backslash = memchr(base + start, Int32(UInt8(ascii: "\\")), (quote ?? bytes.count) - start)
            .map { UnsafeRawPointer(base).distance(to: UnsafeRawPointer($0)) }
        return backslash ?? quote
    }

    /// Appends `number` in decimal, as `String(number)` spells it: its digits filled from the
    /// end of a 20-byte buffer (Int64.min's sign and 19 digits), then appended once.
    static func appendDecimal(_ number: Int64, to output: inout [UInt8]) {
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 20) { digits in
            // The magnitude as unsigned, so that Int64.min has one too.
            var rest = number.magnitude
            var start = digits.count
            repeat {
                start -= 1
                digits[start] = UInt8(ascii: "0") + UInt8(rest % 10)
                rest /= 10
            } while rest > 0
            if number < 0 {
                start -= 1
                digits[start] = UInt8(ascii: "-")
            }
            output.append(contentsOf: UnsafeBufferPointer(rebasing: digits[start...]))
        }
    }
}

extension PostgresValue: ExpressibleByStringLiteral, ExpressibleByIntegerLiteral, ExpressibleByBooleanLiteral, ExpressibleByNilLiteral {
    public init(stringLiteral value: String) { self = .text(value) }
    public init(integerLiteral value: Int64) { self = .int(value) }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    public init(nilLiteral: ()) { self = .null }
}

/// `timestamptz` text in and out (ISO 8601, UTC, microseconds).
enum PostgresTimestamp {
    static func format(_ date: Date) -> String {
        var text: [UInt8] = []
        text.reserveCapacity(29)
        append(date, to: &text)
        return String(decoding: text, as: UTF8.self)
    }

    /// Appends `date` as `YYYY-MM-DD HH:MM:SS.ffffff+00` (rounded to the microsecond) to
    /// `output`: what a COPY row holds for every upstream message, so written in place, its
    /// calendar date computed from the day number (Howard Hinnant's `civil_from_days`)
    /// rather than with `gmtime_r`, which takes glibc's time-zone lock for every row.
    static func append(_ date: Date, to output: inout [UInt8]) {
        let microseconds = Int64((date.timeIntervalSince1970 * 1_000_000).rounded())
        let seconds = microseconds >= 0 ? microseconds / 1_000_000 : (microseconds - 999_999) / 1_000_000
        let fraction = microseconds - seconds * 1_000_000
        let days = seconds >= 0 ? seconds / 86_400 : (seconds - 86_399) / 86_400
        let secondOfDay = seconds - days * 86_400
        // civil_from_days: the proleptic Gregorian date of day `days` after 1970-01-01.
        let shifted = days + 719_468
        let era = (shifted >= 0 ? shifted : shifted - 146_096) / 146_097
        let dayOfEra = shifted - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1_460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let shiftedMonth = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * shiftedMonth + 2) / 5 + 1
        let month = shiftedMonth < 10 ? shiftedMonth + 3 : shiftedMonth - 9
        let year = yearOfEra + era * 400 + (month <= 2 ? 1 : 0)
        // The 29 bytes of `YYYY-MM-DD HH:MM:SS.ffffff+00`, filled in a fixed buffer and
        // appended once: appended one by one, each would check the array's uniqueness and
        // capacity (every COPY row of an upstream message holds one).
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 29) { text in
            var position = 0
            func put(_ byte: UInt8) {
                text[position] = byte
                position += 1
            }
            func digits(_ value: Int64, _ width: Int) {
                var rest = value
                for offset in stride(from: width - 1, through: 0, by: -1) {
                    text[position + offset] = UInt8(48 + rest % 10)
                    rest /= 10
                }
                position += width
            }
            digits(year, 4); put(UInt8(ascii: "-"))
            digits(month, 2); put(UInt8(ascii: "-"))
            digits(day, 2); put(UInt8(ascii: " "))
            digits(secondOfDay / 3_600, 2); put(UInt8(ascii: ":"))
            digits(secondOfDay / 60 % 60, 2); put(UInt8(ascii: ":"))
            digits(secondOfDay % 60, 2); put(UInt8(ascii: "."))
            digits(fraction, 6)
            put(UInt8(ascii: "+")); put(UInt8(ascii: "0")); put(UInt8(ascii: "0"))
            output.append(contentsOf: UnsafeBufferPointer(rebasing: text[..<position]))
        }
    }

    /// Parses `YYYY-MM-DD HH:MM:SS[.ffffff][+HH[:MM[:SS]]]` as PostgreSQL prints it with DateStyle ISO.
    static func parse(_ text: String) -> Date? {
        let bytes = Array(text.utf8)
        guard bytes.count >= 19 else { return nil }
        func number(_ range: Range<Int>) -> Int? {
            var value = 0
            for index in range {
                guard index < bytes.count, (48...57).contains(bytes[index]) else { return nil }
                value = value * 10 + Int(bytes[index] - 48)
            }
            return value
        }
        guard let year = number(0..<4), let month = number(5..<7), let day = number(8..<10),
              let hour = number(11..<13), let minute = number(14..<16), let second = number(17..<19) else { return nil }
        var index = 19
        var fraction = 0.0
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            index += 1
            var scale = 0.1
            while index < bytes.count, (48...57).contains(bytes[index]) {
                fraction += Double(bytes[index] - 48) * scale
                scale /= 10
                index += 1
            }
        }
        var offset = 0
        if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") {
            let sign = bytes[index] == UInt8(ascii: "-") ? -1 : 1
            guard let hours = number((index + 1)..<(index + 3)) else { return nil }
            offset = hours * 3600
            if index + 6 <= bytes.count, bytes[index + 3] == UInt8(ascii: ":"), let minutes = number((index + 4)..<(index + 6)) {
                offset += minutes * 60
            }
            offset *= sign
        }
        var parts = tm()
        parts.tm_year = Int32(year - 1900)
        parts.tm_mon = Int32(month - 1)
        parts.tm_mday = Int32(day)
        parts.tm_hour = Int32(hour)
        parts.tm_min = Int32(minute)
        parts.tm_sec = Int32(second)
        let epoch = timegm(&parts)
        return Date(timeIntervalSince1970: Double(epoch - offset) + fraction)
    }
}
