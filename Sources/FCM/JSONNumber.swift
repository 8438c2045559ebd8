import Foundation

/// A JSON number as its text: a parsed number is written back digit for digit (integers
/// past 2⁵³, `1e400`, `1.50`), and counts as its text in payload sizes. Two numbers are
/// equal when their values are (`1` and `1.0`).
public struct JSONNumber: Sendable, Hashable, ExpressibleByIntegerLiteral, ExpressibleByFloatLiteral, CustomStringConvertible {
    /// The JSON text (RFC 8259 number grammar).
    public let text: String

    /// A number from its JSON text; nil when the text is not a JSON number.
    public init?(text: String) {
        guard JSONNumber.isValid(text) else { return nil }
        self.text = text
    }

    /// The parser's text, already checked.
    init(validated text: String) {
        self.text = text
    }

    /// A whole number.
    public init(_ value: Int) {
        text = String(value)
    }

    /// A number from its value: integral values under 10¹⁵ without a fraction, others as
    /// Swift prints them; an infinity as `±1e999` (which reads back as one), NaN as 0.
    public init(_ value: Double) {
        if value.isNaN {
            text = "0"
        } else if value.isInfinite {
            text = value > 0 ? "1e999" : "-1e999"
        } else if value.rounded() == value && abs(value) < 1e15 {
            text = String(Int64(value))
        } else {
            text = "\(value)"
        }
    }

    public init(integerLiteral value: Int) { self.init(value) }
    public init(floatLiteral value: Double) { self.init(value) }

    /// The value as a `Double` (rounded; `1e400` is infinite).
    public var doubleValue: Double { Double(text) ?? .nan }

    /// The value as an `Int64` when it is a whole number in range (`3`, `3.0`, `3e2`).
    public var int64Value: Int64? {
        if let exact = Int64(text) { return exact }
        guard let decimal = Decimal(string: text), decimal == decimal.rounded else { return nil }
        let number = NSDecimalNumber(decimal: decimal)
        guard number.compare(NSDecimalNumber(value: Int64.max)) != .orderedDescending,
              number.compare(NSDecimalNumber(value: Int64.min)) != .orderedAscending else { return nil }
        return number.int64Value
    }

    public var description: String { text }

    public static func == (a: JSONNumber, b: JSONNumber) -> Bool {
        if a.text == b.text { return true }
        if let x = a.exactValue, let y = b.exactValue { return x == y }
        return a.doubleValue == b.doubleValue
    }

    public func hash(into hasher: inout Hasher) {
        if let exact = exactValue { hasher.combine(exact) } else { hasher.combine(doubleValue) }
    }

    /// The value to the digit, when `Decimal` holds it (38 digits, exponents to ±127).
    private var exactValue: Decimal? {
        guard let decimal = Decimal(string: text), decimal.isFinite else { return nil }
        return decimal
    }

    /// True for the JSON number grammar: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
    static func isValid(_ text: String) -> Bool {
        var bytes = Array(text.utf8)[...]
        if bytes.first == UInt8(ascii: "-") { bytes = bytes.dropFirst() }
        func digits() -> Int {
            let count = bytes.prefix { (48...57).contains($0) }.count
            bytes = bytes.dropFirst(count)
            return count
        }
        if bytes.first == UInt8(ascii: "0") {
            bytes = bytes.dropFirst()
        } else if digits() == 0 {
            return false
        }
        if bytes.first == UInt8(ascii: ".") {
            bytes = bytes.dropFirst()
            if digits() == 0 { return false }
        }
        if bytes.first == UInt8(ascii: "e") || bytes.first == UInt8(ascii: "E") {
            bytes = bytes.dropFirst()
            if bytes.first == UInt8(ascii: "+") || bytes.first == UInt8(ascii: "-") { bytes = bytes.dropFirst() }
            if digits() == 0 { return false }
        }
        return bytes.isEmpty
    }
}

private extension Decimal {
    var rounded: Decimal {
        var value = self, result = Decimal()
        NSDecimalRound(&result, &value, 0, .plain)
        return result
    }
}
