import Foundation

/// One result row. Values arrive in text format; the accessors decode them by the
/// column's type, returning nil for SQL NULL.
public struct PostgresRow: Sendable, Equatable {
    /// The column names, shared by every row of a result.
    public let columns: [String]
    /// The raw text of each value, nil for NULL.
    public let values: [String?]

    public init(columns: [String], values: [String?]) {
        self.columns = columns
        self.values = values
    }

    public subscript(_ index: Int) -> String? { values[index] }

    /// The index of the column named `name`.
    public func index(of name: String) -> Int? { columns.firstIndex(of: name) }

    public func string(_ index: Int) -> String? { values[index] }
    public func string(_ name: String) -> String? { index(of: name).flatMap { values[$0] } }

    public func int(_ index: Int) -> Int64? { values[index].flatMap { Int64($0) } }
    public func int(_ name: String) -> Int64? { index(of: name).flatMap(int) }

    public func double(_ index: Int) -> Double? { values[index].flatMap { Double($0) } }

    public func bool(_ index: Int) -> Bool? { values[index].map { $0 == "t" || $0 == "true" } }
    public func bool(_ name: String) -> Bool? { index(of: name).flatMap(bool) }

    /// A `bytea` value (hex output format).
    public func bytes(_ index: Int) -> [UInt8]? { values[index].flatMap(Self.parseBytea) }

    /// Parses `bytea` hex output: `\x0a1b…`.
    static func parseBytea(_ text: String) -> [UInt8]? {
        guard text.hasPrefix("\\x") else { return nil }
        var result: [UInt8] = []
        result.reserveCapacity((text.utf8.count - 2) / 2)
        var high: UInt8?
        for byte in text.utf8.dropFirst(2) {
            let nibble: UInt8
            switch byte {
            case 48...57: nibble = byte - 48
            case 97...102: nibble = byte - 87
            case 65...70: nibble = byte - 55
            default: return nil
            }
            if let h = high { result.append(h << 4 | nibble); high = nil } else { high = nibble }
        }
        return high == nil ? result : nil
    }

    /// A `json`/`jsonb` value as JSON text.
    public func json(_ index: Int) -> String? { values[index] }
    public func json(_ name: String) -> String? { string(name) }

    /// A `timestamptz` value.
    public func date(_ index: Int) -> Date? { values[index].flatMap(PostgresTimestamp.parse) }
    public func date(_ name: String) -> Date? { index(of: name).flatMap(date) }

    /// A one-dimensional `text[]` value (NULL elements dropped); nil for SQL NULL or a
    /// value that is not an array literal.
    public func strings(_ index: Int) -> [String]? { values[index].flatMap(Self.parseTextArray) }

    /// Parses PostgreSQL's array output: `{a,"b c","d\"e",NULL}`; NULL elements dropped.
    static func parseTextArray(_ literal: String) -> [String]? {
        parseArrayElements(literal)?.compactMap { $0 }
    }

    /// Parses a one-dimensional array's output, NULL elements as nil.
    static func parseArrayElements(_ literal: String) -> [String?]? {
        var scalars = literal.unicodeScalars[...]
        guard scalars.first == "{", scalars.last == "}" else { return nil }
        scalars = scalars.dropFirst().dropLast()
        var items: [String?] = []
        var current = String.UnicodeScalarView()
        var quoted = false, wasQuoted = false, escaped = false
        func finish() {
            let text = String(current)
            items.append(wasQuoted || text != "NULL" ? text : nil)
            current = String.UnicodeScalarView()
            wasQuoted = false
        }
        if scalars.isEmpty { return [] }
        for scalar in scalars {
            if escaped {
                current.append(scalar)
                escaped = false
            } else if scalar == "\\" {
                escaped = true
            } else if scalar == "\"" {
                quoted.toggle()
                wasQuoted = true
            } else if scalar == ",", !quoted {
                finish()
            } else {
                current.append(scalar)
            }
        }
        finish()
        return items
    }
}

/// The outcome of one statement.
public struct PostgresResult: Sendable, Equatable {
    public let rows: [PostgresRow]
    /// Rows inserted, updated or deleted (the command tag's count), 0 when not applicable.
    public let affectedRows: Int

    public init(rows: [PostgresRow], affectedRows: Int) {
        self.rows = rows
        self.affectedRows = affectedRows
    }
}

/// One statement with its parameters, or a `COPY … FROM STDIN` with its rows.
public struct PostgresStatement: Sendable, Equatable {
    public var sql: String
    public var parameters: [PostgresValue]
    /// The data of a `COPY … FROM STDIN` statement, nil for any other statement.
    package private(set) var copyData: PostgresCopyData?

    /// The rows of a `COPY … FROM STDIN` statement (see `copy(into:columns:rows:)`), nil
    /// for any other statement.
    public var copyRows: [[PostgresValue]]? { copyData?.rows }

    public init(_ sql: String, _ parameters: [PostgresValue] = []) {
        self.sql = sql
        self.parameters = parameters
    }

    /// `COPY table (columns) FROM STDIN` with `rows` as its data (each row one value per
    /// column, in PostgreSQL's text format: NULL, quotes, tabs and newlines travel safely).
    ///
    /// COPY is PostgreSQL's cheapest way to add many rows: it inserts them in bulk (one WAL
    /// record per page instead of one per row, no executor work per row). What it saves is
    /// that per-row work, not the tables' index upkeep: on the worker's `upstream_messages`
    /// (three indexes) it cost 14–20 % less than an `INSERT … SELECT FROM unnest(…)`. It
    /// has no `ON CONFLICT`: a row that breaks a constraint fails the whole statement.
    ///
    /// In a pipeline (`PostgresConnection.pipeline`) a COPY runs as one simple query together
    /// with the statements without parameters right before and after it (`BEGIN`, `COMMIT`,
    /// SQL with literals), so that `BEGIN; COPY …; COMMIT` costs two round trips: libpq does
    /// not allow COPY in pipeline mode, and the rows can only follow the server's go-ahead.
    /// - Parameters:
    ///   - table: the table's name, quoted here (pass it unquoted; a schema-qualified name
    ///     as `schema.table` is quoted part by part).
    ///   - columns: the column names, quoted here.
    public static func copy(into table: String, columns: [String], rows: [[PostgresValue]]) -> PostgresStatement {
        var statement = copyStatement(into: table, columns: columns)
        statement.copyData = .rows(rows)
        return statement
    }

    /// `copy(into:columns:rows:)` with the rows' values one after another, `columns.count`
    /// per row: one list for the whole batch instead of one per row (a batch handler's
    /// allocation per message). A count of values that is not a multiple of the columns'
    /// fails the statement before anything is sent.
    public static func copy(into table: String, columns: [String], values: [PostgresValue]) -> PostgresStatement {
        var statement = copyStatement(into: table, columns: columns)
        statement.copyData = .values(values, perRow: columns.count)
        return statement
    }

    /// `COPY table (columns) FROM STDIN`, its names quoted.
    private static func copyStatement(into table: String, columns: [String]) -> PostgresStatement {
        let name = table.split(separator: ".", omittingEmptySubsequences: false).map { PostgresConnection.quoteIdentifier(String($0)) }
            .joined(separator: ".")
        return PostgresStatement("COPY \(name) (\(columns.map(PostgresConnection.quoteIdentifier).joined(separator: ", "))) FROM STDIN")
    }
}

/// A NOTIFY received on a LISTENing connection.
public struct PostgresNotification: Sendable, Equatable {
    public let channel: String
    public let payload: String

    public init(channel: String, payload: String) {
        self.channel = channel
        self.payload = payload
    }
}
