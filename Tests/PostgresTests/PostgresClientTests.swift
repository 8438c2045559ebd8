import Runtime
import Foundation
import Postgres
import Synchronization
import Testing

@Suite struct PostgresClientTests {
    private func connect() async throws -> PostgresConnection {
        try await PostgresConnection.connect(try testDatabaseURL())
    }

    @Test func valuesRoundTripThroughEveryDecodedType() async throws {
        let connection = try await connect()
        defer { Task { await connection.close() } }
        let date = Date(timeIntervalSince1970: 1_764_500_000.123456)
        let rows = try await connection.query(
            "SELECT $1::text, $2::bigint, $3::bool, $4::bytea, $5::jsonb, $6::timestamptz, $7::text, $8::float8",
            [.text("héllo 'quoted' \"x\" \\ 😀"), .int(-9_007_199_254_740_993), .bool(true), .bytea([0, 1, 0xFE, 0xFF]),
             .jsonb("{\"b\": [1, 2], \"a\": \"x\"}"), .timestamptz(date), .null, .double(2.5)])
        let row = try #require(rows.first)
        #expect(row.string(0) == "héllo 'quoted' \"x\" \\ 😀")
        #expect(row.int(1) == -9_007_199_254_740_993)
        #expect(row.bool(2) == true)
        #expect(row.bytes(3) == [0, 1, 0xFE, 0xFF])
        #expect(row.json(4) == "{\"a\": \"x\", \"b\": [1, 2]}")
        #expect(abs(try #require(row.date(5)).timeIntervalSince(date)) < 0.000_001)
        #expect(row.string(6) == nil)
        #expect(row.double(7) == 2.5)
    }

    @Test func textArraysDecodeWithQuotesEscapesAndNulls() async throws {
        let connection = try await connect()
        defer { Task { await connection.close() } }
        let values = ["plain", "with space", "comma,inside", "quote\"inside", "back\\slash", "NULL", "{braces}", ""]
        let rows = try await connection.query("SELECT $1::text[] || ARRAY[NULL]::text[], '{}'::text[], NULL::text[]",
                                              [.array(values.map { .text($0) })])
        let row = try #require(rows.first)
        #expect(row.strings(0) == values, "NULL elements are dropped; the string \"NULL\" is kept")
        #expect(row.strings(1) == [])
        #expect(row.strings(2) == nil)
    }

    @Test func arrayParametersFeedUnnest() async throws {
        let connection = try await connect()
        defer { Task { await connection.close() } }
        let values: [PostgresValue] = [.text("a,b"), .text("with \"quotes\" and \\"), .null, .text("{brace}")]
        let rows = try await connection.query("SELECT x FROM unnest($1::text[]) AS x", [.array(values)])
        #expect(rows.map { $0.string(0) } == ["a,b", "with \"quotes\" and \\", nil, "{brace}"])
        // Integers are written straight into the literal, unquoted, as String(_:) spells them.
        let numbers: [PostgresValue] = [.int(0), .int(-5), .int(.min), .int(.max), .null, .int(1_764_672_000_123_456)]
        #expect(PostgresValue.array(numbers).textEncoding == "{0,-5,-9223372036854775808,9223372036854775807,NULL,1764672000123456}")
        let decoded = try await connection.query("SELECT x FROM unnest($1::bigint[]) AS x", [.array(numbers)])
        #expect(decoded.map { $0.int(0) } == [0, -5, .min, .max, nil, 1_764_672_000_123_456])
    }

    /// An array's text elements with quotes and backslashes anywhere (first, last, side by
    /// side, alone), against the rule written out byte by byte, and through PostgreSQL.
    @Test func arrayElementsEscapeEveryQuoteAndBackslashWhereverTheyAre() async throws {
        let pieces = ["a", "\"", "\\", "$", "é", ",", "{", " "]
        var elements = ["", "\"", "\\", "\\\"", "\"\\", "a\"\"b", "end\\", String(repeating: "x\"y\\", count: 40)]
        var state: UInt64 = 7
        for _ in 0..<200 {
            var element = ""
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            for shift in stride(from: 0, to: Int(state >> 61) * 8, by: 3) { element += pieces[Int((state >> UInt64(shift)) & 7)] }
            elements.append(element)
        }
        var expected = "{"
        for (index, element) in elements.enumerated() {
            if index > 0 { expected += "," }
            expected += "\""
            for character in element { expected += character == "\"" || character == "\\" ? "\\\(character)" : "\(character)" }
            expected += "\""
        }
        expected += "}"
        let values = elements.map { PostgresValue.text($0) }
        #expect(PostgresValue.array(values).textEncoding == expected)
        let connection = try await connect()
        defer { Task { await connection.close() } }
        let rows = try await connection.query("SELECT x FROM unnest($1::text[]) AS x", [.array(values)])
        #expect(rows.map { $0.string(0) } == elements)
        let spliced = try await connection.query("SELECT x FROM unnest(\(PostgresValue.array(values).sqlLiteral)::text[]) AS x")
        #expect(spliced.map { $0.string(0) } == elements)
    }

    @Test func aValueHoldingNulIsRefusedBeforeAnythingIsSentNotCutShort() async throws {
        let connection = try await connect()
        defer { Task { await connection.close() } }
        let table = "nul_test_\(UInt32.random(in: 0...UInt32.max))"
        try await connection.execute("CREATE TABLE \(table) (t text)")
        defer { Task { try? await connection.execute("DROP TABLE \(table)") } }
        do {
            _ = try await connection.query("SELECT $1::text", [.text("cut\u{0}tail")])
            Issue.record("a parameter holding U+0000 was sent")
        } catch let error as PostgresError {
            #expect(error.kind == .statement)
            #expect(error.message.contains("parameter $1 holds U+0000"), "\(error)")
        }
        // In a pipeline the statement is named, and nothing before it ran either.
        do {
            _ = try await connection.pipeline([
                PostgresStatement("INSERT INTO \(table) VALUES ($1)", [.text("before")]),
                PostgresStatement("INSERT INTO \(table) VALUES ($1)", [.array([.text("a"), .text("b\u{0}")])]),
            ])
            Issue.record("an array holding U+0000 was sent")
        } catch let error as PostgresError {
            #expect(error.statementIndex == 1)
        }
        await #expect(throws: PostgresError.self) { try await connection.simpleQuery("SELECT 1; SELECT '\u{0}'") }
        #expect(try await connection.query("SELECT count(*) FROM \(table)").first?.int(0) == 0)
    }

    @Test func parametersAreNeverSplicedIntoSQL() async throws {
        let connection = try await connect()
        defer { Task { await connection.close() } }
        let hostile = "x'); DROP TABLE pg_class; --"
        let rows = try await connection.query("SELECT $1::text = $2::text", [.text(hostile), .text(hostile)])
        #expect(rows.first?.bool(0) == true)
    }

    @Test func transactionsCommitOrRollBackAndSavepointsIsolate() async throws {
        let connection = try await connect()
        defer { Task { await connection.close() } }
        let table = "tx_test_\(UInt32.random(in: 0...UInt32.max))"
        try await connection.execute("CREATE TABLE \(table) (id int primary key)")
        defer { Task { try? await connection.execute("DROP TABLE \(table)") } }
        try await connection.transaction { tx in
            try await tx.execute("INSERT INTO \(table) VALUES (1)")
            await #expect(throws: PostgresError.self) {
                try await tx.savepoint { sp in try await sp.execute("INSERT INTO \(table) VALUES (1)") }
            }
            try await tx.execute("INSERT INTO \(table) VALUES (2)")
        }
        await #expect(throws: PostgresError.self) {
            try await connection.transaction { tx in
                try await tx.execute("INSERT INTO \(table) VALUES (3)")
                try await tx.execute("INSERT INTO \(table) VALUES (1)")
            }
        }
        let ids = try await connection.query("SELECT id FROM \(table) ORDER BY id").compactMap { $0.int(0) }
        #expect(ids == [1, 2])
        do {
            try await connection.execute("INSERT INTO \(table) VALUES (1)")
        } catch let error as PostgresError {
            #expect(error.isUniqueViolation)
        }
    }

    @Test func pipelinesRunManyStatementsAndReportTheFailingOne() async throws {
        let connection = try await connect()
        defer { Task { await connection.close() } }
        let table = "pipe_test_\(UInt32.random(in: 0...UInt32.max))"
        try await connection.execute("CREATE TABLE \(table) (id int primary key)")
        defer { Task { try? await connection.execute("DROP TABLE \(table)") } }
        var statements = [PostgresStatement("BEGIN")]
        statements += (1...500).map { PostgresStatement("INSERT INTO \(table) VALUES ($1)", [.int(Int64($0))]) }
        statements.append(PostgresStatement("COMMIT"))
        let results = try await connection.pipeline(statements)
        #expect(results.count == 502)
        #expect(results[1].affectedRows == 1)
        #expect(try await connection.query("SELECT count(*) FROM \(table)").first?.int(0) == 500)

        do {
            _ = try await connection.pipeline([
                PostgresStatement("BEGIN"),
                PostgresStatement("INSERT INTO \(table) VALUES (1000)"),
                PostgresStatement("INSERT INTO \(table) VALUES (1)"),
                PostgresStatement("INSERT INTO \(table) VALUES (1001)"),
                PostgresStatement("COMMIT"),
            ])
            Issue.record("a duplicate key went through")
        } catch let error as PostgresError {
            #expect(error.statementIndex == 2)
            #expect(error.isUniqueViolation)
        }
        try await connection.execute("ROLLBACK")
        #expect(try await connection.query("SELECT count(*) FROM \(table)").first?.int(0) == 500)
    }

    @Test func pipelinedStatementsArePreparedOncePerConnectionAndFailedPreparationsAreNotKept() async throws {
        let connection = try await connect()
        defer { Task { await connection.close() } }
        let table = "prep_test_\(UInt32.random(in: 0...UInt32.max))"
        try await connection.execute("CREATE TABLE \(table) (id int primary key)")
        defer { Task { try? await connection.execute("DROP TABLE \(table)") } }
        let insert = "INSERT INTO \(table) VALUES ($1)"
        func prepared() async throws -> [String] {
            try await connection.query("SELECT statement FROM pg_prepared_statements ORDER BY name").compactMap { $0.string(0) }
        }
        for round in 0..<3 {
            _ = try await connection.pipeline([PostgresStatement("BEGIN")]
                + (1...10).map { PostgresStatement(insert, [.int(Int64(round * 10 + $0))]) } + [PostgresStatement("COMMIT")])
        }
        #expect(try await prepared() == [insert])
        #expect(try await connection.query("SELECT count(*) FROM \(table)").first?.int(0) == 30)

        // A statement whose preparation fails reports its own index; one whose preparation
        // the failure aborted is prepared by a later pipeline.
        let broken = "INSERT INTO \(table) VALUES ($1) RETURNING nonexistent"
        let later = "SELECT $1::int + 1"
        do {
            _ = try await connection.pipeline([PostgresStatement("BEGIN"), PostgresStatement(broken, [.int(100)]),
                                               PostgresStatement(later, [.int(1)]), PostgresStatement("COMMIT")])
            Issue.record("a broken statement went through")
        } catch let error as PostgresError {
            #expect(error.statementIndex == 1)
            #expect(error.message.contains("nonexistent"))
        }
        try await connection.execute("ROLLBACK")
        #expect(try await prepared() == [insert])
        let results = try await connection.pipeline([PostgresStatement(later, [.int(41)])])
        #expect(results.first?.rows.first?.int(0) == 42)
        #expect(Set(try await prepared()) == [insert, later])
        await #expect(throws: PostgresError.self) { _ = try await connection.pipeline([PostgresStatement(broken, [.int(101)])]) }

        // Past the limit, new texts still run (unprepared).
        let texts = (0..<70).map { "SELECT $1::int + \($0)" }
        let sums = try await connection.pipeline(texts.map { PostgresStatement($0, [.int(1)]) })
        #expect(sums.map { $0.rows.first?.int(0) } == (0..<70).map { Int64($0 + 1) })
        #expect(try await prepared().count == 64)
    }

    @Test func singleStatementsArePreparedTooAndRecoverWhenATableChangesShape() async throws {
        let connection = try await connect()
        defer { Task { await connection.close() } }
        let table = "shape_test_\(UInt32.random(in: 0...UInt32.max))"
        try await connection.execute("CREATE TABLE \(table) (id int)")
        defer { Task { try? await connection.execute("DROP TABLE \(table)") } }
        let insert = "INSERT INTO \(table) VALUES ($1)", select = "SELECT * FROM \(table) WHERE id = $1"
        for id in 1...3 { try await connection.execute(insert, [.int(Int64(id))]) }
        #expect(try await connection.query(select, [.int(2)]).first?.values == ["2"])
        let names = try await connection.query("SELECT statement FROM pg_prepared_statements").compactMap { $0.string(0) }
        #expect(Set(names) == [insert, select])
        // A statement that cannot be prepared reports its error and is not kept.
        await #expect(throws: PostgresError.self) { try await connection.query("SELECT nonexistent FROM \(table) WHERE id = $1", [.int(1)]) }
        // `SELECT *` changes shape with the table: the first run after it fails, then it
        // is prepared afresh.
        try await connection.execute("ALTER TABLE \(table) ADD COLUMN note text DEFAULT 'n'")
        await #expect { _ = try await connection.query(select, [.int(2)]) } throws: { ($0 as? PostgresError)?.sqlState == "0A000" }
        #expect(try await connection.query(select, [.int(2)]).first?.values == ["2", "n"])
    }

    /// Behind a pooler that moves a client between server connections, a statement run by
    /// name must be the one its name was prepared for: names come from the SQL text, so two
    /// connections give one text one name and two texts two names (they were numbered per
    /// connection, and `fcm_1` of one connection was another statement on the next server).
    /// A name the server does not hold is an error that says so.
    @Test func aPreparedStatementsNameStandsForItsSQLTextOnEveryConnection() async throws {
        let first = try await PostgresConnection.connect(try testDatabaseURL())
        let second = try await PostgresConnection.connect(try testDatabaseURL())
        defer { Task { await first.close(); await second.close() } }
        _ = try await first.query("SELECT $1::int + 1", [.int(1)])
        _ = try await second.query("SELECT $1::int + 2", [.int(1)])
        _ = try await second.query("SELECT $1::int + 1", [.int(1)])
        func prepared(_ connection: PostgresConnection) async throws -> [String: String] {
            Dictionary(uniqueKeysWithValues: try await connection.query("SELECT name, statement FROM pg_prepared_statements")
                .compactMap { row in row.string(0).flatMap { name in row.string(1).map { (name, $0) } } })
        }
        let onFirst = try await prepared(first), onSecond = try await prepared(second)
        #expect(onFirst.count == 1 && onSecond.count == 2)
        // One name, one text, whichever connection prepared it.
        for (name, statement) in onFirst {
            #expect(name.hasPrefix("fcm_"))
            #expect(onSecond[name] == statement)
        }
        #expect(Set(onSecond.values) == ["SELECT $1::int + 1", "SELECT $1::int + 2"])
        // The server lost the statement (as on another server connection): the error says so,
        // and the connection is no longer used.
        let name = try #require(onFirst.keys.first)
        _ = try await first.execute("DEALLOCATE \(name)")
        await #expect { _ = try await first.query("SELECT $1::int + 1", [.int(1)]) } throws: {
            ($0 as? PostgresError)?.meansPreparedStatementsAreNotKept == true
        }
        #expect(first.preparedStatementsNotKept != nil)
        #expect(!first.isHealthy)
    }

    @Test func theSameSQLSTATEFromAStatementNotRunByNameSaysNothingAboutPreparedStatements() async throws {
        let connection = try await PostgresConnection.connect(try testDatabaseURL())
        defer { Task { await connection.close() } }
        // 26000 raised by a statement that has no parameters (so is not prepared), whose
        // message even names an fcm_ statement: not the pooler's doing.
        await #expect { try await connection.execute(#"DO $$ BEGIN RAISE EXCEPTION 'prepared statement "fcm_0" does not exist' USING ERRCODE = '26000'; END $$"#) } throws: {
            let error = $0 as? PostgresError
            return error?.sqlState == "26000" && error?.meansPreparedStatementsAreNotKept == false && error?.isDatabaseState == false
        }
        #expect(connection.preparedStatementsNotKept == nil)
        #expect(connection.isHealthy)
    }

    @Test func errorsOfTheDatabasesStateAreToldFromTheStatementsOwn() {
        func error(_ state: String) -> PostgresError { PostgresError(kind: .statement, sqlState: state, message: "m") }
        for state in ["08006", "57P01", "57P03", "53300", "53100", "58030", "25006"] {
            #expect(error(state).isDatabaseState, "\(state)")
        }
        for state in ["23505", "22P02", "42P01", "40001", "26000", "42P05", "XX000"] {
            #expect(!error(state).isDatabaseState, "\(state)")
        }
        #expect(PostgresError(kind: .connection, message: "gone").isDatabaseState)
        #expect(PostgresError(kind: .statement, sqlState: "26000", message: "m", preparedStatementNotKept: true).isDatabaseState)
    }

    @Test func aConnectionThatDoesNotPrepareLeavesNoPreparedStatements() async throws {
        let connection = try await PostgresConnection.connect(try testDatabaseURL(), preparesStatements: false)
        defer { Task { await connection.close() } }
        _ = try await connection.query("SELECT $1::int", [.int(1)])
        _ = try await connection.pipeline([PostgresStatement("SELECT $1::int + 1", [.int(1)])])
        #expect(try await connection.query("SELECT count(*) FROM pg_prepared_statements").first?.int(0) == 0)
    }

    @Test func notificationsArriveOnAListeningConnection() async throws {
        let listener = try await connect()
        let sender = try await connect()
        defer { Task { await listener.close(); await sender.close() } }
        try await listener.listen("fcm_test_channel")
        try await sender.execute("SELECT pg_notify('fcm_test_channel', $1)", [.text("hello")])
        let notification = try await listener.nextNotification(timeout: .seconds(5))
        #expect(notification == PostgresNotification(channel: "fcm_test_channel", payload: "hello"))
        #expect(try await listener.nextNotification(timeout: .milliseconds(50)) == nil)
    }

    @Test func thePoolBoundsConnectionsAndReplacesBrokenOnes() async throws {
        let pool = PostgresPool(target: try PostgresConnectionString(testDatabaseURL()), size: 2)
        let gauge = InFlightGauge()
        let pids = try await withThrowingTaskGroup(of: Int64.self) { group in
            for _ in 0..<6 {
                group.addTask {
                    try await pool.withConnection { connection in
                        gauge.enter()
                        defer { gauge.leave() }
                        try await connection.execute("SELECT pg_sleep(0.05)")
                        return try await connection.query("SELECT pg_backend_pid()").first?.int(0) ?? 0
                    }
                }
            }
            return try await group.reduce(into: Set<Int64>()) { $0.insert($1) }
        }
        #expect(gauge.maximum == 2)
        #expect(pids.count == 2)  // six jobs, two connections reused
        // A connection killed by the server is replaced transparently on the next checkout.
        let pid = try await pool.withConnection { try await $0.query("SELECT pg_backend_pid()").first?.int(0) ?? 0 }
        let admin = try await connect()
        try await admin.execute("SELECT pg_terminate_backend($1::int)", [.int(pid)])
        for _ in 0..<2 {
            _ = try? await pool.withConnection { try await $0.query("SELECT 1") }
        }
        let answer = try await pool.withConnection { try await $0.query("SELECT 42").first?.int(0) }
        #expect(answer == 42)
        await admin.close()
        await pool.close()
    }

    @Test func thePoolRollsBackATransactionItsBorrowerLeftOpenOrAborted() async throws {
        let pool = PostgresPool(target: try PostgresConnectionString(testDatabaseURL()), size: 1)
        let table = "pool_leftover_\(UInt32.random(in: 0...UInt32.max))"
        _ = try await pool.withConnection { try await $0.execute("CREATE TABLE \(table) (n int)") }
        // Left open: the insert must not commit along with the next borrower's work.
        try await pool.withConnection { connection in
            try await connection.execute("BEGIN")
            try await connection.execute("INSERT INTO \(table) VALUES (1)")
            #expect(!connection.isOutsideTransaction)
        }
        // Aborted: without a rollback, the next borrower's statements would fail (25P02).
        await #expect(throws: PostgresError.self) {
            try await pool.withConnection { connection in
                try await connection.pipeline([PostgresStatement("BEGIN"), PostgresStatement("SELECT 1 / $1::int", [.int(0)])])
            }
        }
        let (count, outside) = try await pool.withConnection { connection in
            (try await connection.query("SELECT count(*) FROM \(table)").first?.int(0), connection.isOutsideTransaction)
        }
        #expect(count == 0)
        #expect(outside)
        _ = try await pool.withConnection { try await $0.execute("DROP TABLE \(table)") }
        await pool.close()
    }

    @Test func passwordsAreRedactedFromErrors() async throws {
        do {
            _ = try await PostgresConnection.connect("postgresql://someone:hunter2secret@127.0.0.1:1/db", timeout: .seconds(2))
        } catch let error as PostgresError {
            #expect(!error.description.contains("hunter2secret"))
        }
    }
}

/// Counts how many tasks hold a connection at once.
final class InFlightGauge: Sendable {
    private let state = BlockingLock((current: 0, maximum: 0))
    func enter() { state.withLock { $0.current += 1; $0.maximum = max($0.maximum, $0.current) } }
    func leave() { state.withLock { $0.current -= 1 } }
    var maximum: Int { state.withLock { $0.maximum } }
}
