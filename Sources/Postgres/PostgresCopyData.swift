/// The rows of a `COPY … FROM STDIN` statement (`PostgresStatement.copy`): a list per row,
/// or every row's values in one list.
package enum PostgresCopyData: Sendable, Equatable {
    case rows([[PostgresValue]])
    /// Rows of `perRow` values each, one after another.
    case values([PostgresValue], perRow: Int)

    /// The rows, one list each (a trailing partial row as it is).
    var rows: [[PostgresValue]] {
        switch self {
        case .rows(let rows): rows
        case .values(let values, let perRow):
            perRow > 0 ? stride(from: 0, to: values.count, by: perRow).map { Array(values[$0..<min($0 + perRow, values.count)]) } : []
        }
    }

    /// Why the data cannot be sent, or nil: values that do not fill whole rows.
    var problem: String? {
        guard case .values(let values, let perRow) = self else { return nil }
        if perRow == 0 { return values.isEmpty ? nil : "COPY of \(values.count) value(s) into no columns" }
        guard values.count % perRow != 0 else { return nil }
        return "COPY of \(values.count) value(s) into \(perRow) columns: not a whole number of rows"
    }

    /// Appends the rows in COPY's text format to `bytes`, calling `chunkFull` whenever
    /// `bytes` has grown past `chunkBytes`.
    func encode<E: Error>(to bytes: inout [UInt8], chunkBytes: Int, _ chunkFull: (inout [UInt8]) throws(E) -> Void) throws(E) {
        switch self {
        case .rows(let rows):
            for row in rows {
                PostgresCopyText.append(row: row, to: &bytes)
                if bytes.count >= chunkBytes { try chunkFull(&bytes) }
            }
        case .values(let values, let perRow):
            guard perRow > 0 else { return }
            var start = 0
            while start < values.count {
                PostgresCopyText.append(row: values[start..<min(start + perRow, values.count)], to: &bytes)
                if bytes.count >= chunkBytes { try chunkFull(&bytes) }
                start += perRow
            }
        }
    }
}
