internal import CLibPQ

extension PostgresResult {
    /// The rows (in libpq's text format) and the affected-row count of a successful
    /// `PGresult`, copied out: the result may be cleared afterwards.
    init(reading result: OpaquePointer) {
        let rowCount = PQntuples(result), columnCount = PQnfields(result)
        var columns: [String] = []
        columns.reserveCapacity(Int(columnCount))
        for column in 0..<columnCount { columns.append(String(cString: PQfname(result, column))) }
        var rows: [PostgresRow] = []
        rows.reserveCapacity(Int(rowCount))
        for row in 0..<rowCount {
            var values: [String?] = []
            values.reserveCapacity(Int(columnCount))
            for column in 0..<columnCount {
                values.append(PQgetisnull(result, row, column) == 1 ? nil : String(cString: PQgetvalue(result, row, column)))
            }
            rows.append(PostgresRow(columns: columns, values: values))
        }
        self.init(rows: rows, affectedRows: Int(String(cString: PQcmdTuples(result))) ?? 0)
    }
}
