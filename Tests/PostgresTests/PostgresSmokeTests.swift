import Foundation
@testable import Postgres
import Testing

/// The database `scripts/test` starts, from `DATABASE_URL`.
func testDatabaseURL() throws -> String {
    guard let url = ProcessInfo.processInfo.environment["DATABASE_URL"], !url.isEmpty else {
        throw PostgresError(kind: .configuration, message: "DATABASE_URL is not set: run the tests with scripts/test")
    }
    return url
}

@Suite struct PostgresSmokeTests {
    @Test func theTestClusterIsLiveAndIsPostgreSQL15() async throws {
        let connection = try await PostgresConnection.connect(try testDatabaseURL())
        let rows = try await connection.query("SELECT current_setting('server_version_num')::int / 10000, $1::text", ["ping"])
        #expect(rows.map(\.values) == [["15", "ping"]])
        await connection.close()
    }

    @Test func serverErrorsCarryTheirSQLState() async throws {
        let connection = try await PostgresConnection.connect(try testDatabaseURL())
        await #expect(throws: PostgresError.self) { try await connection.query("SELECT * FROM no_such_table") }
        do {
            _ = try await connection.query("SELECT 1/0")
            Issue.record("division by zero succeeded")
        } catch let error as PostgresError {
            #expect(error.sqlState == "22012")
            #expect(error.kind == .statement)
        }
        await connection.close()
    }

    @Test func anUnreachableServerIsAConnectionError() async throws {
        do {
            _ = try await PostgresConnection.connect("postgresql://postgres@127.0.0.1:1/none", timeout: .seconds(2))
            Issue.record("connected to port 1")
        } catch let error as PostgresError {
            #expect(error.kind == .connection)
        }
    }
}

@Suite struct PostgresConnectionStringTests {
    @Test func passwordsAreLeftOutWhateverTheirForm() throws {
        let keyword = try PostgresConnectionString("host=db user=fcm password='two words' dbname=fcm")
        #expect(keyword.description == "user=fcm password=*** dbname=fcm host=db", "in libpq's order of keywords")
        #expect(keyword["password"] == "two words")
        let spaced = try PostgresConnectionString("host=db password = s3cret dbname=fcm")
        #expect(!spaced.description.contains("s3cret"))
        let url = try PostgresConnectionString("postgresql://:s3cret@db.internal:6432/fcm?sslmode=require")
        #expect(!url.description.contains("s3cret"))
        #expect(url.description.contains("host=db.internal") && url.description.contains("port=6432"))
        // A password written as part of a connection string is left out of any text...
        #expect(url.redact("failed for postgresql://:s3cret@db.internal/fcm") == "failed for postgresql://:***@db.internal/fcm")
        // ...and its characters elsewhere are left alone: a short one cannot mangle a
        // message, a statement's name or a label (password `fcm`: once `***_cc7e…`).
        let short = try PostgresConnectionString("postgresql://fcm:fcm@db/fcm")
        #expect(short.redact(#"prepared statement "fcm_cc7ed3b0851beb2a" does not exist"#)
                == #"prepared statement "fcm_cc7ed3b0851beb2a" does not exist"#)
        #expect(PostgresConnectionString.redactPatterns("password='two words' host=x") == "password=*** host=x")
        #expect(PostgresConnectionString.redactPatterns("password = s3cret\n\tline two") == "password = *** line two")
        #expect(PostgresConnectionString.redactPatterns("postgres://u:p%40ss@h/d") == "postgres://u:***@h/d")
    }

    @Test func anUnparsableStringFailsWithoutQuotingIt() {
        for text in ["postgresql://u:s3cret@h/db?x=%zz", "host=h password=s3cret =", "postgresql://u:s3cret@[::1/db"] {
            #expect(throws: PostgresError.self) { try PostgresConnectionString(text) }
            do { _ = try PostgresConnectionString(text) } catch {
                #expect(error.kind == .configuration)
                #expect(!error.message.contains("s3cret"), "\(error.message)")
            }
        }
    }

    /// The message still says what is wrong where it shows no password (it said
    /// `missing "…" after "…"` for every mistake), and hides the part that shows one.
    @Test func anUnparsableStringsMessageShowsWhatIsWrongButNotThePassword() {
        func message(_ text: String) -> String {
            do { _ = try PostgresConnectionString(text) } catch { return error.message }
            return "parsed"
        }
        #expect(message("host=h dbname") == #"the database URL cannot be parsed: missing "=" after "dbname" in connection info string"#)
        #expect(message("postgresql://u:pw@h/db?sslmode")
                == #"the database URL cannot be parsed: missing key/value separator "=" in URI query parameter: "sslmode""#)
        #expect(message("postgresql://u:s3cr%zzet@h/db") == #"the database URL cannot be parsed: invalid percent-encoded token: "…""#)
        #expect(message("host=h password=s3cret dbname") == #"the database URL cannot be parsed: missing "=" after "dbname" in connection info string"#)
    }

    @Test func keepalivesAndATCPUserTimeoutAreOnUnlessTheStringSaysOtherwise() throws {
        let plain = try PostgresConnectionString("postgresql://u@h/d").adding(ConnectionHandle.networkDefaults)
        #expect(plain.contains { $0 == ("keepalives", "1") })
        #expect(plain.contains { $0 == ("keepalives_idle", "30") })
        #expect(plain.contains { $0 == ("tcp_user_timeout", "30000") })
        let tuned = try PostgresConnectionString("postgresql://u@h/d?keepalives_idle=7&tcp_user_timeout=0").adding(ConnectionHandle.networkDefaults)
        #expect(tuned.filter { $0.keyword == "keepalives_idle" }.map(\.value) == ["7"])
        #expect(tuned.filter { $0.keyword == "tcp_user_timeout" }.map(\.value) == ["0"])
    }
}

@Suite struct PostgresJSONBTests {
    @Test func whatJSONBRefusesIsFoundAndWhatItTakesIsNot() async throws {
        let connection = try await PostgresConnection.connect(try testDatabaseURL())
        defer { Task { await connection.close() } }
        let texts = [#"{"a":"x\u0000y"}"#, #"{"\u0000":1}"#, #"["\ud800"]"#, #"["\udc00"]"#, #"["\ud800\u0041"]"#,
                     #"{"n":1e131072}"#, #"{"n":1e1000000}"#, #"{"n":1e-16384}"#, #"{"n":0.1e-16383}"#,
                     #"{"a":"\\u0000 is text here"}"#, #"["\ud83d\ude00"]"#, #"{"n":1e131071}"#, #"{"n":1e-16383}"#,
                     #"{"n":123456789012345678901234567890}"#, #"{"n":-0.0e5,"b":[true,null]}"#, #"{"n":0e999999}"#]
        for text in texts {
            // PostgreSQL itself is the judge.
            var accepted = true
            do { _ = try await connection.query("SELECT $1::jsonb", [.text(text)]) } catch { accepted = false }
            #expect((PostgresJSONB.refusal(of: text) == nil) == accepted, "\(text): jsonb \(accepted ? "takes" : "refuses") it")
        }
    }
}
