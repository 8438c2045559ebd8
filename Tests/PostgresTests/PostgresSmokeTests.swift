import Foundation
import Postgres
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
