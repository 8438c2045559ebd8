@testable import Postgres
import Testing

/// The names a connection prepares statements under, as pure state (no server).
@Suite struct PreparedStatementNamesTests {
    private let insert = PostgresStatement("INSERT INTO t (a) VALUES ($1)", [.text("x")])

    @Test func aNameIsTheSQLTextsDigestTheSameOnEveryConnection() throws {
        let first = try #require(PreparedStatementNames(limit: 10).newName(for: insert))
        let second = try #require(PreparedStatementNames(limit: 10).newName(for: insert))
        #expect(first == second)
        #expect(first == "fcm_" + String(PreparedStatementNames.digest(insert.sql), radix: 16).leftPadded(to: 16))
        #expect(first.count == 20)
        let other = PreparedStatementNames(limit: 10).newName(for: PostgresStatement("SELECT $1", [.text("x")]))
        #expect(other != first)
    }

    @Test func theDigestIsFNV1a64() {
        // The published FNV-1a 64-bit test vectors.
        #expect(PreparedStatementNames.digest("") == 0xcbf2_9ce4_8422_2325)
        #expect(PreparedStatementNames.digest("a") == 0xaf63_dc4c_8601_ec8c)
        #expect(PreparedStatementNames.digest("foobar") == 0x8594_4171_f739_67e8)
    }

    @Test func statementsWithoutParametersAreNotPrepared() {
        #expect(PreparedStatementNames(limit: 10).newName(for: PostgresStatement("SELECT 1")) == nil)
    }

    @Test func theLimitCountsPreparedAndPendingStatements() {
        var names = PreparedStatementNames(limit: 2)
        names.names["SELECT $1"] = "fcm_a"
        #expect(names.newName(for: insert) != nil)
        #expect(names.newName(for: insert, pending: 1) == nil, "one prepared and one pending fill a limit of 2")
        #expect(PreparedStatementNames(limit: 0).newName(for: insert) == nil, "a limit of zero prepares nothing")
    }

    @Test func aStalePlanIsForgottenAndItsNextPreparationGetsANameOfItsOwn() throws {
        var names = PreparedStatementNames(limit: 10)
        let first = try #require(names.newName(for: insert))
        names.names[insert.sql] = first
        names.forgetIfStale(insert.sql, after: PostgresError(kind: .statement, sqlState: "23505", message: "duplicate key"))
        #expect(names.names[insert.sql] == first, "another error keeps the preparation")
        names.forgetIfStale(insert.sql, after: PostgresError(kind: .statement, sqlState: "0A000", message: "cached plan must not change result type"))
        #expect(names.names[insert.sql] == nil)
        #expect(names.newName(for: insert) == first + "_1")
        names.forgetIfStale(insert.sql, after: PostgresError(kind: .statement, sqlState: "0A000", message: "again"))
        #expect(names.newName(for: insert) == first + "_2")
    }
}

private extension String {
    func leftPadded(to width: Int) -> String { String(repeating: "0", count: max(0, width - count)) + self }
}
