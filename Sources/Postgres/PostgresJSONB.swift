/// What PostgreSQL's `jsonb` refuses in JSON text that is otherwise valid (RFC 8259):
/// the escape `\u0000`, a lone UTF-16 surrogate escape, and numbers outside `numeric`'s
/// range (more than 131,072 digits before the decimal point, more than 16,383 after).
/// Checking first keeps one such message from failing a whole batch's transaction.
public enum PostgresJSONB {
    /// Why `text` (valid JSON) cannot be stored as `jsonb`, or nil when it can.
    public static func refusal(of text: String) -> String? {
        var text = text
        return text.withUTF8 { bytes -> String? in
            var index = 0
            while index < bytes.count {
                switch bytes[index] {
                case UInt8(ascii: "\""):
                    if let problem = scanString(bytes, &index) { return problem }
                case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
                    if let problem = scanNumber(bytes, &index) { return problem }
                default:
                    index += 1
                }
            }
            return nil
        }
    }

    /// Moves past a string starting at `index` (its opening quote).
    private static func scanString(_ bytes: UnsafeBufferPointer<UInt8>, _ index: inout Int) -> String? {
        index += 1
        var pendingHigh = false
        while index < bytes.count {
            let byte = bytes[index]
            if byte == UInt8(ascii: "\"") {
                index += 1
                return pendingHigh ? "a lone UTF-16 surrogate escape" : nil
            }
            guard byte == UInt8(ascii: "\\"), index + 1 < bytes.count else {
                if pendingHigh { return "a lone UTF-16 surrogate escape" }
                index += 1
                continue
            }
            guard bytes[index + 1] == UInt8(ascii: "u"), index + 5 < bytes.count,
                  let unit = UInt16(String(decoding: UnsafeBufferPointer(rebasing: bytes[(index + 2)..<(index + 6)]), as: UTF8.self), radix: 16) else {
                if pendingHigh { return "a lone UTF-16 surrogate escape" }
                index += 2
                continue
            }
            index += 6
            switch unit {
            case 0: return "the escape \\u0000 (jsonb cannot hold a NUL character)"
            case 0xD800...0xDBFF:
                if pendingHigh { return "a lone UTF-16 surrogate escape" }
                pendingHigh = true
            case 0xDC00...0xDFFF:
                if !pendingHigh { return "a lone UTF-16 surrogate escape" }
                pendingHigh = false
            default:
                if pendingHigh { return "a lone UTF-16 surrogate escape" }
            }
        }
        return nil
    }

    /// Moves past a number starting at `index`; checks it against `numeric`'s range.
    private static func scanNumber(_ bytes: UnsafeBufferPointer<UInt8>, _ index: inout Int) -> String? {
        func isDigit(_ byte: UInt8) -> Bool { (48...57).contains(byte) }
        if bytes[index] == UInt8(ascii: "-") { index += 1 }
        var significant = 0, leadingZeros = true
        while index < bytes.count, isDigit(bytes[index]) {
            if bytes[index] != UInt8(ascii: "0") { leadingZeros = false }
            if !leadingZeros { significant += 1 }
            index += 1
        }
        var fraction = 0
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            index += 1
            while index < bytes.count, isDigit(bytes[index]) {
                fraction += 1
                index += 1
            }
        }
        var exponent = 0
        if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
            index += 1
            var negative = false
            if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") {
                negative = bytes[index] == UInt8(ascii: "-")
                index += 1
            }
            while index < bytes.count, isDigit(bytes[index]) {
                // Saturate: anything past a few million is out of range either way.
                if exponent < 10_000_000 { exponent = exponent * 10 + Int(bytes[index] - 48) }
                index += 1
            }
            if negative { exponent = -exponent }
        }
        // Digits before the point once the exponent is applied, and digits after it.
        if significant > 0 && significant + exponent > 131_072 { return "a number too large for numeric" }
        if fraction - exponent > 16_383 { return "a number with more than 16,383 digits after the point" }
        return nil
    }
}
