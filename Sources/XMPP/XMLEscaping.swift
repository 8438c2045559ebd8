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
            for byte in bytes where needsEscape(byte, inAttribute: inAttribute) { return false }
            return true
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
