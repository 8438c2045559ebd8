/// Rows in the text format of `COPY … FROM STDIN`: one line per row, values separated by
/// tabs, `\N` for NULL, and backslash, tab, newline and carriage return escaped with a
/// backslash (PostgreSQL's documented text format, default delimiter and null string).
package enum PostgresCopyText {
    /// Appends `row` as one line to `bytes`.
    package static func append(row: [PostgresValue], to bytes: inout [UInt8]) {
        appendLine(row, to: &bytes)
    }

    /// Appends `row`, a slice of a list of rows' values, as one line to `bytes`.
    package static func append(row: ArraySlice<PostgresValue>, to bytes: inout [UInt8]) {
        appendLine(row, to: &bytes)
    }

    @inline(__always)
    private static func appendLine<Row: Collection<PostgresValue>>(_ row: Row, to bytes: inout [UInt8]) {
        var first = true
        for value in row {
            if !first { bytes.append(UInt8(ascii: "\t")) }
            first = false
            // The row's usual kinds are written from the value itself: no String is made
            // for a timestamp, and text goes out without a copy of the String.
            switch value {
            case .timestamptz(let date):
                PostgresTimestamp.append(date, to: &bytes)
            case .text(let text), .jsonb(let text):
                appendEscaped(text, to: &bytes)
            default:
                if let text = value.textEncoding {
                    appendEscaped(text, to: &bytes)
                } else {
                    // NULL.
                    bytes.append(UInt8(ascii: "\\"))
                    bytes.append(UInt8(ascii: "N"))
                }
            }
        }
        bytes.append(UInt8(ascii: "\n"))
    }

    /// Appends `text` with backslash, tab, newline and carriage return escaped.
    @inline(__always)
    private static func appendEscaped(_ text: String, to bytes: inout [UInt8]) {
        let done: Void? = text.utf8.withContiguousStorageIfAvailable { appendEscaped(bytes: $0, to: &bytes) }
        if done == nil {
            // A bridged or otherwise non-contiguous string: its UTF-8, made contiguous.
            var copy = text
            copy.withUTF8 { appendEscaped(bytes: $0, to: &bytes) }
        }
    }

    @inline(__always)
    private static func appendEscaped(bytes source: UnsafeBufferPointer<UInt8>, to bytes: inout [UInt8]) {
        // Runs without a special byte are copied whole.
        var start = 0
        for (offset, byte) in source.enumerated() {
            let escaped: UInt8
            switch byte {
            case UInt8(ascii: "\\"): escaped = UInt8(ascii: "\\")
            case UInt8(ascii: "\t"): escaped = UInt8(ascii: "t")
            case UInt8(ascii: "\n"): escaped = UInt8(ascii: "n")
            case UInt8(ascii: "\r"): escaped = UInt8(ascii: "r")
            default: continue
            }
            bytes.append(contentsOf: UnsafeBufferPointer(rebasing: source[start..<offset]))
            bytes.append(UInt8(ascii: "\\"))
            bytes.append(escaped)
            start = offset + 1
        }
        bytes.append(contentsOf: UnsafeBufferPointer(rebasing: source[start...]))
    }
}
