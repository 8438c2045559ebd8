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
        for (index, value) in row.enumerated() {
            if index > 0 { bytes.append(UInt8(ascii: "\t")) }
            if case .timestamptz(let date) = value {
                // Digits and punctuation only: nothing to escape, no string of its own.
                PostgresTimestamp.append(date, to: &bytes)
                continue
            }
            guard var text = value.textEncoding else {
                bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "N")])
                continue
            }
            text.withUTF8 { source in
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
        bytes.append(UInt8(ascii: "\n"))
    }
}
