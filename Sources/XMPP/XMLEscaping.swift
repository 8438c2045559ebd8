/// Escaping of text and attribute values for XML output.
///
/// Text escapes `&`, `<` and `>`; attribute values also escape both quotes and the
/// whitespace characters that attribute normalisation would otherwise turn into spaces.
/// Characters XML 1.0 cannot carry at all (most C0 controls) are replaced by U+FFFD.
public enum XMLEscaping {
    /// Appends `text` escaped for element content.
    public static func appendText(_ text: String, to output: inout String) {
        append(text, to: &output, inAttribute: false)
    }

    /// Appends `value` escaped for a double-quoted attribute.
    public static func appendAttribute(_ value: String, to output: inout String) {
        append(value, to: &output, inAttribute: true)
    }

    /// `text` escaped for element content.
    public static func escapeText(_ text: String) -> String {
        var output = ""
        appendText(text, to: &output)
        return output
    }

    private static func append(_ text: String, to output: inout String, inAttribute: Bool) {
        // Fast path: nothing to escape.
        var scanned = text
        let plain = scanned.withUTF8 { bytes in
            inAttribute ? !bytes.contains { needsEscape($0, inAttribute: true) } : isPlainText(bytes)
        }
        if plain {
            output += text
            return
        }
        for scalar in text.unicodeScalars {
            switch scalar {
            case "&": output += "&amp;"
            case "<": output += "&lt;"
            case ">": output += "&gt;"
            case "\"" where inAttribute: output += "&quot;"
            case "'" where inAttribute: output += "&apos;"
            case "\n" where inAttribute: output += "&#10;"
            case "\r": output += "&#13;"
            case "\t" where inAttribute: output += "&#9;"
            case "\t", "\n": output.unicodeScalars.append(scalar)
            default:
                if scalar.value < 0x20 || scalar.value == 0xFFFE || scalar.value == 0xFFFF {
                    output += "\u{FFFD}"
                } else {
                    output.unicodeScalars.append(scalar)
                }
            }
        }
    }

    /// True when no byte of `bytes` needs escaping in element content. Eight bytes at a
    /// time: a word goes byte by byte only when it may hold such a byte (one below 0x20,
    /// `&`, `<`, `>` or 0xEF), which JSON text seldom does; byte by byte, this scan was
    /// about 2 % of the worker's CPU per downstream message.
    static func isPlainText(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        guard let base = UnsafeRawPointer(bytes.baseAddress) else { return true }
        var offset = 0
        while offset + 8 <= bytes.count {
            let word = UInt64(littleEndian: base.loadUnaligned(fromByteOffset: offset, as: UInt64.self))
            if mayNeedEscape(word) {
                for index in offset..<offset + 8 where needsEscape(bytes[index], inAttribute: false) { return false }
            }
            offset += 8
        }
        for index in offset..<bytes.count where needsEscape(bytes[index], inAttribute: false) { return false }
        return true
    }

    private static let ones: UInt64 = 0x0101_0101_0101_0101
    private static let highBits: UInt64 = 0x8080_8080_8080_8080

    /// True when a byte of `word` may be one `needsEscape` (outside attributes) holds true
    /// for; never false when one is (it may be true when none is, after a byte that is).
    @inline(__always)
    private static func mayNeedEscape(_ word: UInt64) -> Bool {
        // A byte below 0x20 (the classic "has less than" test; bytes of 0x80 and more never
        // count), then a byte equal to each of the others (a zero byte after the XOR).
        func hasZero(_ value: UInt64) -> UInt64 { (value &- ones) & ~value & highBits }
        let below20 = (word &- ones &* 0x20) & ~word & highBits
        return below20 | hasZero(word ^ (ones &* 0x26)) | hasZero(word ^ (ones &* 0x3C)) | hasZero(word ^ (ones &* 0x3E))
            | hasZero(word ^ (ones &* 0xEF)) != 0
    }

    @inline(__always)
    private static func needsEscape(_ byte: UInt8, inAttribute: Bool) -> Bool {
        switch byte {
        case UInt8(ascii: "&"), UInt8(ascii: "<"), UInt8(ascii: ">"), UInt8(ascii: "\r"): return true
        case UInt8(ascii: "\""), UInt8(ascii: "'"), UInt8(ascii: "\n"), UInt8(ascii: "\t"): return inAttribute
        case 0xEF: return true  // may start U+FFFE / U+FFFF; the slow path decides
        default: return byte < 0x20 && byte != UInt8(ascii: "\n") && byte != UInt8(ascii: "\t")
        }
    }
}
