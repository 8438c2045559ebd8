import Foundation
import Postgres
import Worker
import TestSupport

/// A fresh schema in the test cluster (`DATABASE_URL` from scripts/test), so that tests
/// running in parallel never see each other's rows.
struct TestDatabase {
    let schema: String
    /// A URL whose sessions use only this schema.
    let url: String

    static var baseURL: String {
        get throws {
            guard let url = ProcessInfo.processInfo.environment["DATABASE_URL"], !url.isEmpty else {
                throw PostgresError(kind: .configuration, message: "DATABASE_URL is not set: run the tests with scripts/test")
            }
            return url
        }
    }

    /// The repository's migrations folder (the source of `MigrationSet.worker`).
    static let migrationsDirectory = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("migrations").path

    /// Makes the schema; with `migrated`, applies the project's migrations to it.
    static func make(migrated: Bool = true) async throws -> TestDatabase {
        let base = try baseURL
        let schema = "t_" + UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "").prefix(16)
        let admin = try await PostgresConnection.connect(base)
        try await admin.execute("CREATE SCHEMA \(schema)")
        await admin.close()
        let url = withPassword(base) + (base.contains("?") ? "&" : "?") + "options=-csearch_path%3D\(schema)"
        let database = TestDatabase(schema: String(schema), url: url)
        if migrated {
            let connection = try await database.connect()
            try await Migrator(sets: [.worker]).migrate(connection)
            await connection.close()
        }
        return database
    }

    /// `url` with the test password added to its user: every URL a worker gets carries one.
    static func withPassword(_ url: String) -> String {
        url.replacingOccurrences(of: "://postgres@", with: "://postgres:\(TestSecrets.databasePassword)@")
    }

    func connect() async throws -> PostgresConnection {
        try await PostgresConnection.connect(url)
    }

    /// Runs one query on a short-lived connection.
    func query(_ sql: String, _ parameters: [PostgresValue] = []) async throws -> [PostgresRow] {
        let connection = try await connect()
        defer { Task { await connection.close() } }
        return try await connection.query(sql, parameters)
    }

    /// Waits until `table` holds at least `count` rows, or `limit` passes (the caller then
    /// asserts the count, so a shortfall fails the test with the actual number).
    func waitForRows(in table: String, count: Int, within limit: Duration) async {
        try? await waitUntil("\(count) rows in \(table)", within: limit, every: .milliseconds(20)) {
            (try? await self.count(table)).map { $0 >= count } ?? false
        }
    }

    /// The message ids in `upstream_messages` (what the `store` handler kept).
    func storedMessageIDs() async throws -> Set<String> {
        Set(try await query("SELECT message_id FROM upstream_messages").compactMap { $0.string(0) })
    }

    func count(_ table: String, where condition: String = "true") async throws -> Int {
        Int(try await query("SELECT count(*) FROM \(table) WHERE \(condition)").first?.int(0) ?? -1)
    }
}

extension TestDatabase {
    /// A database of its own (not just a schema), for tests that cut it off.
    static func makeDedicated() async throws -> (TestDatabase, name: String) {
        let base = try baseURL
        let name = "d_" + UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "").prefix(12)
        let admin = try await PostgresConnection.connect(base)
        try await admin.execute("CREATE DATABASE \(name)")
        await admin.close()
        guard let slash = base.range(of: "/", options: .backwards) else { throw PostgresError(kind: .configuration, message: "odd DATABASE_URL") }
        let url = withPassword(String(base[..<slash.upperBound]) + name)
        let database = TestDatabase(schema: "public", url: url)
        let connection = try await database.connect()
        try await Migrator(sets: [.worker]).migrate(connection)
        await connection.close()
        return (database, String(name))
    }

    /// Refuses new connections to database `name` and drops the open ones (an outage).
    static func cutOff(_ name: String) async throws {
        let admin = try await PostgresConnection.connect(try baseURL)
        try await admin.execute("ALTER DATABASE \(name) ALLOW_CONNECTIONS false")
        try await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", [.text(name)])
        await admin.close()
    }

    /// Ends the outage of `cutOff`.
    static func restore(_ name: String) async throws {
        let admin = try await PostgresConnection.connect(try baseURL)
        try await admin.execute("ALTER DATABASE \(name) ALLOW_CONNECTIONS true")
        await admin.close()
    }
}
