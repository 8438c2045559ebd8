/// The statements one connection prepared on the server, by SQL text, and the names new
/// ones get: pure state, kept by the connection's `ConnectionHandle`.
///
/// Statements with parameters are prepared on first use, up to `limit`: past it, new SQL
/// texts run unprepared (so handlers that build SQL text on the fly cannot grow the server's
/// memory). Zero prepares none.
struct PreparedStatementNames {
    /// SQL text → the server-side prepared statement made for it on this connection.
    var names: [String: String] = [:]
    /// SQL text → how many of its preparations were given up after their plan went stale:
    /// the next one gets a name of its own. (A preparation that failed left nothing on the
    /// server, and its name is used again.)
    private var retired: [String: Int] = [:]
    let limit: Int

    init(limit: Int) {
        self.limit = limit
    }

    /// A fresh name to prepare `statement` under, or nil when it has no parameters or the
    /// limit is reached (`pending`: preparations sent but not yet confirmed).
    ///
    /// The name is made from the SQL text (`fcm_` and a 64-bit FNV-1a digest, then `_N` for
    /// a text prepared again), never from a counter: a name means one SQL text on every
    /// connection. Behind a pooler that hands each transaction another server connection,
    /// a statement run by name then either is the same SQL or is missing (SQLSTATE 26000,
    /// or 42P05 when preparing a name that exists), never another statement that happens
    /// to share a counter's name.
    func newName(for statement: PostgresStatement, pending: Int = 0) -> String? {
        guard !statement.parameters.isEmpty, names.count + pending < limit else { return nil }
        let digest = String(Self.digest(statement.sql), radix: 16)
        let base = "fcm_" + String(repeating: "0", count: 16 - digest.count) + digest
        let retired = retired[statement.sql] ?? 0
        return retired == 0 ? base : "\(base)_\(retired)"
    }

    /// FNV-1a, 64 bits, of the SQL text's UTF-8 bytes.
    static func digest(_ sql: String) -> UInt64 {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in sql.utf8 {
            hash ^= UInt64(byte)
            hash = hash &* 0x0000_0100_0000_01b3
        }
        return hash
    }

    /// A prepared statement whose tables changed shape (`SELECT *` after `ALTER TABLE`)
    /// fails with "cached plan must not change result type" until it is prepared again:
    /// forget it, so the next run of that SQL prepares a fresh one under a new name. (The
    /// old one stays on the server until the connection closes: one per such change.)
    mutating func forgetIfStale(_ sql: String, after error: PostgresError) {
        guard error.sqlState == "0A000" else { return }
        names[sql] = nil
        retired[sql, default: 0] += 1
    }
}
