import Foundation
@testable import Postgres
import Testing

/// `PostgresStatement.copy`: rows reach the table exactly, inside pipelines and
/// transactions, and a failing COPY fails like any statement.
@Suite struct PostgresCopyTests {
    private func connect() async throws -> PostgresConnection {
        try await PostgresConnection.connect(try testDatabaseURL())
    }

    /// A fresh table for one test, dropped after it.
    private func withTable(_ connection: PostgresConnection, _ columns: String,
                           _ body: (String) async throws -> Void) async throws {
        let table = "copy_test_\(UInt32.random(in: 0...UInt32.max))"
        try await connection.execute("CREATE TABLE \(table) (\(columns))")
        do { try await body(table) } catch {
            _ = try? await connection.execute("ROLLBACK")
            _ = try? await connection.execute("DROP TABLE \(table)")
            throw error
        }
        try await connection.execute("DROP TABLE \(table)")
    }

    @Test func valuesThatNeedEscapingArriveExactly() async throws {
        let connection = try await connect()
        defer { Task { await connection.close() } }
        try await withTable(connection, "n int, t text, j jsonb, at timestamptz, tags text[]") { table in
            let date = Date(timeIntervalSince1970: 1_764_500_000.123456)
            let texts = ["tab\there", "line\nbreak", "carriage\rreturn", "back\\slash \\N \\.", "\\N", "", "héllo 😀", "\"quoted\"", ".\n\\.\n"]
            let rows: [[PostgresValue]] = texts.enumerated().map { index, text in
                [.int(Int64(index)), .text(text), .jsonb("{\"v\": \"\(text.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\n", with: "\\n").replacingOccurrences(of: "\t", with: "\\t").replacingOccurrences(of: "\r", with: "\\r").replacingOccurrences(of: "\"", with: "\\\""))\"}"),
                 .timestamptz(date), .array([.text(text), .null])]
            } + [[.int(99), .null, .null, .null, .null]]
            let results = try await connection.pipeline([.copy(into: table, columns: ["n", "t", "j", "at", "tags"], rows: rows)])
            #expect(results.map(\.affectedRows) == [rows.count])
            let stored = try await connection.query("SELECT t, j->>'v', at, tags[1], tags[2] IS NULL, t IS NULL FROM \(table) ORDER BY n")
            #expect(stored.count == rows.count)
            for (index, text) in texts.enumerated() {
                #expect(stored[index].string(0) == text)
                #expect(stored[index].string(1) == text)
                #expect(abs(try #require(stored[index].date(2)).timeIntervalSince(date)) < 0.000_001)
                #expect(stored[index].string(3) == text)
                #expect(stored[index].bool(4) == true)
            }
            #expect(stored.last?.bool(5) == true, "NULL arrives as NULL, not as text")
        }
    }

    /// `sqlLiteral` (the ids of a batch's check, spliced into the simple query of its COPY)
    /// picks a dollar-quote tag its text does not hold, wherever the text holds the others.
    @Test func anSQLLiteralArrivesExactlyWhateverTagsItsTextHolds() async throws {
        let connection = try await connect()
        defer { Task { await connection.close() } }
        let texts = ["plain", "", "$fcm$", "a$fcm$b$fcm1$c", "$fcm1$$fcm$$fcm2", "$fcm", "fcm$", "$$", "héllo 😀 $fcm$",
                     "'quote' and \\ backslash", "ends with $fcm"]
        for text in texts {
            let literal = PostgresValue.text(text).sqlLiteral
            let stored = try await connection.query("SELECT \(literal)::text")
            #expect(stored.first?.string(0) == text, "\(literal)")
        }
        #expect(PostgresValue.text("a$fcm$b$fcm1$c").sqlLiteral == "$fcm2$a$fcm$b$fcm1$c$fcm2$")
        #expect(PostgresValue.null.sqlLiteral == "NULL")
        let ids = PostgresValue.array([.text("x$fcm$"), .text("y")]).sqlLiteral
        #expect(try await connection.query("SELECT (\(ids)::text[])[1]").first?.string(0) == "x$fcm$")
    }

    @Test func aTransactionOfCopiesAndParameterizedStatementsKeepsItsOrder() async throws {
        let connection = try await connect()
        defer { Task { await connection.close() } }
        try await withTable(connection, "n int primary key, source text") { table in
            let results = try await connection.pipeline([
                PostgresStatement("BEGIN"),
                PostgresStatement("INSERT INTO \(table) VALUES ($1, 'param')", [.int(1)]),
                PostgresStatement("INSERT INTO \(table) VALUES (2, 'literal');  \n"),
                .copy(into: table, columns: ["n", "source"], rows: [[.int(3), .text("copy")], [.int(4), .text("copy")]]),
                PostgresStatement("INSERT INTO \(table) SELECT n + 10000, 'after ' || source FROM \(table) WHERE n = $1", [.int(3)]),
                .copy(into: table, columns: ["n", "source"], rows: (5..<5000).map { [.int(Int64($0)), .text(String(repeating: "x", count: 40))] }),
                PostgresStatement("SELECT count(*) FROM \(table)"),
                PostgresStatement("COMMIT"),
            ])
            #expect(results.count == 8)
            #expect(results[3].affectedRows == 2)
            #expect(results[4].affectedRows == 1, "the statement after a COPY sees its rows")
            #expect(results[5].affectedRows == 4995, "a COPY larger than one chunk of data")
            #expect(results[6].rows.first?.int(0) == 5000)
            let count = try await connection.query("SELECT count(*) FROM \(table)").first?.int(0)
            #expect(count == 5000)
        }
    }

    @Test func aCopyThatBreaksAConstraintFailsTheTransactionAndLeavesTheConnectionUsable() async throws {
        let connection = try await connect()
        defer { Task { await connection.close() } }
        try await withTable(connection, "n int primary key") { table in
            try await connection.execute("INSERT INTO \(table) VALUES (2)")
            do {
                _ = try await connection.pipeline([
                    PostgresStatement("BEGIN"),
                    PostgresStatement("INSERT INTO \(table) VALUES ($1)", [.int(1)]),
                    .copy(into: table, columns: ["n"], rows: [[.int(3)], [.int(2)], [.int(4)]]),
                    PostgresStatement("COMMIT"),
                ])
                Issue.record("the COPY should have failed")
            } catch let error as PostgresError {
                #expect(error.isUniqueViolation)
                #expect(error.statementIndex == 2)
                #expect(error.kind == .statement)
            }
            try await connection.execute("ROLLBACK")
            let rows = try await connection.query("SELECT n FROM \(table) ORDER BY n")
            #expect(rows.map { $0.int(0) } == [2], "nothing of the failed transaction is kept")
            // A statement before the COPY fails: the COPY never starts, the error is that statement's.
            do {
                _ = try await connection.pipeline([
                    PostgresStatement("BEGIN"),
                    PostgresStatement("INSERT INTO \(table) VALUES (2)"),
                    .copy(into: table, columns: ["n"], rows: [[.int(5)]]),
                    PostgresStatement("COMMIT"),
                ])
                Issue.record("the INSERT should have failed")
            } catch let error as PostgresError {
                #expect(error.isUniqueViolation)
                #expect(error.statementIndex == 1)
            }
            try await connection.execute("ROLLBACK")
            // Bad data fails the COPY with the server's reason.
            await #expect(throws: PostgresError.self) {
                try await connection.run(.copy(into: table, columns: ["n"], rows: [[.text("not a number")]]))
            }
            _ = try await connection.run(.copy(into: table, columns: ["n"], rows: [[.int(7)]]))
            let after = try await connection.query("SELECT n FROM \(table) ORDER BY n")
            #expect(after.map { $0.int(0) } == [2, 7])
        }
    }

    /// `copy(into:columns:values:)`: the same rows as `copy(into:columns:rows:)` arrive from
    /// one list of values, across COPY's 64 KiB chunks; a count that is not a whole number of
    /// rows fails the statement before anything is sent, and the connection goes on.
    @Test func valuesInOneListArriveAsTheRowsTheyMake() async throws {
        let connection = try await connect()
        defer { Task { await connection.close() } }
        try await withTable(connection, "n int, t text") { table in
            let rows: [[PostgresValue]] = (0..<3000).map { [.int(Int64($0)), $0 % 7 == 0 ? .null : .text("row\t\($0) " + String(repeating: "x", count: 40))] }
            let statement = PostgresStatement.copy(into: table, columns: ["n", "t"], values: rows.flatMap { $0 })
            #expect(statement.copyRows == rows)
            #expect(statement.sql == PostgresStatement.copy(into: table, columns: ["n", "t"], rows: rows).sql)
            let results = try await connection.pipeline([PostgresStatement("BEGIN"), statement, PostgresStatement("COMMIT")])
            #expect(results[1].affectedRows == rows.count)
            let stored = try await connection.query("SELECT n, t FROM \(table) ORDER BY n")
            #expect(stored.count == rows.count)
            #expect(stored.allSatisfy { row in
                let n = row.int(0) ?? -1
                return n % 7 == 0 ? row.string(1) == nil : row.string(1) == "row\t\(n) " + String(repeating: "x", count: 40)
            })

            do {
                _ = try await connection.run(.copy(into: table, columns: ["n", "t"], values: [.int(1), .text("a"), .int(2)]))
                Issue.record("three values into two columns should have failed")
            } catch let error as PostgresError {
                #expect(error.kind == .statement)
                #expect(error.message.contains("3 value(s) into 2 columns"))
            }
            _ = try await connection.run(.copy(into: table, columns: ["n", "t"], values: [.int(5000), .text("after")]))
            #expect(try await connection.query("SELECT count(*) FROM \(table)").first?.int(0) == Int64(rows.count + 1))
        }
    }

    @Test func copiesGoInSimpleQueriesWithTheParameterlessStatementsAroundThem() {
        func statement(_ kind: Character) -> PostgresStatement {
            switch kind {
            case "c": .copy(into: "t", columns: ["a"], rows: [])
            case "p": PostgresStatement("SELECT $1", [.int(1)])
            default: PostgresStatement("SELECT 1")
            }
        }
        func split(_ kinds: String) -> [PipelineGroup] { PipelineGroup.split(kinds.map(statement)) }
        #expect(split("scs") == [.simple([0, 1, 2])])
        #expect(split("spcs") == [.pipelined([0, 1]), .simple([2, 3])])
        #expect(split("spscps") == [.pipelined([0, 1]), .simple([2, 3]), .pipelined([4, 5])])
        #expect(split("cc") == [.simple([0]), .simple([1])])
        #expect(split("psp") == [.pipelined([0, 1, 2])])
        #expect(split("cssp") == [.simple([0, 1, 2]), .pipelined([3])])
        #expect(split("") == [])
    }

    @Test func tableAndColumnNamesAreQuoted() {
        let statement = PostgresStatement.copy(into: "app.Messages", columns: ["id", "we\"ird"], rows: [[.int(1), .null]])
        #expect(statement.sql == "COPY \"app\".\"Messages\" (\"id\", \"we\"\"ird\") FROM STDIN")
        #expect(statement.copyRows == [[.int(1), .null]])
        #expect(PostgresStatement("SELECT 1").copyRows == nil)
    }

    @Test func textFormatEscapesTheFourSpecialBytesAndNull() {
        var bytes: [UInt8] = []
        PostgresCopyText.append(row: [.text("a\tb\nc\rd\\e"), .null, .int(5), .text("")], to: &bytes)
        #expect(String(decoding: bytes, as: UTF8.self) == "a\\tb\\nc\\rd\\\\e\t\\N\t5\t\n")
    }
}
