/// What went wrong talking to PostgreSQL, with the server's SQLSTATE where it gave one.
///
/// Descriptions never contain the connection string's password.
public struct PostgresError: Error, CustomStringConvertible, Sendable {
    /// The broad class of failure, which decides what a caller should do next.
    public enum Kind: Sendable, Equatable {
        /// Could not connect, or the connection broke: retry after a pause.
        case connection
        /// The server rejected a statement; `sqlState` says why.
        case statement
        /// The connection string or setting is unusable: fix the configuration.
        case configuration
    }

    public let kind: Kind
    /// The five-character SQLSTATE, for example `23505` for a unique violation.
    public let sqlState: String?
    /// The server's or libpq's message.
    public let message: String

    /// In a pipeline, the index of the statement that failed.
    public let statementIndex: Int?
    /// True when the statement that failed was one this client prepared, run by its name
    /// (or its preparation), and the SQLSTATE says the server does not hold it (26000) or
    /// held it already (42P05). Set where the statement is known, never read from the
    /// message's text.
    public let preparedStatementNotKept: Bool

    public init(kind: Kind, sqlState: String? = nil, message: String, statementIndex: Int? = nil,
                preparedStatementNotKept: Bool = false) {
        self.kind = kind
        self.sqlState = sqlState
        self.message = message
        self.statementIndex = statementIndex
        self.preparedStatementNotKept = preparedStatementNotKept
    }

    /// True for SQLSTATE 23505.
    public var isUniqueViolation: Bool { sqlState == "23505" }
    /// True for SQLSTATE 40001.
    public var isSerializationFailure: Bool { sqlState == "40001" }
    /// True when a statement this client prepared was missing on the server (26000) or was
    /// there before this client prepared it (42P05): the connection goes through a pooler
    /// that hands each transaction another server connection (PgBouncer's transaction or
    /// statement mode), which does not keep a client's prepared statements. Connect without
    /// prepared statements behind such a pooler.
    public var meansPreparedStatementsAreNotKept: Bool { preparedStatementNotKept }

    /// True when the error is the database's state, not the statement's or the message's:
    /// the connection failed or broke (class 08), the server is shutting down or was
    /// restarted (57P), it is out of resources (class 53: too many connections, disk full,
    /// out of memory), a system error (58), a read-only server where a primary was (25006:
    /// a standby after a failover), or a pooler that does not keep prepared statements.
    /// A caller pauses as in an outage and tries again; it never counts against a message.
    public var isDatabaseState: Bool {
        if kind == .connection || preparedStatementNotKept { return true }
        guard let sqlState else { return false }
        return sqlState.hasPrefix("08") || sqlState.hasPrefix("57P") || sqlState.hasPrefix("53") || sqlState.hasPrefix("58")
            || sqlState == "25006"
    }

    public var description: String {
        switch kind {
        case .connection: "PostgreSQL connection error: \(message)"
        case .configuration: "PostgreSQL configuration error: \(message)"
        case .statement: "PostgreSQL error\(sqlState.map { " \($0)" } ?? ""): \(message)"
        }
    }
}
