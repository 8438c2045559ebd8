import Foundation
import Postgres

/// Applies `migrations/NNNN_name.sql` files in order, each in its own transaction, and
/// records them with a SHA-256 checksum in `schema_migrations`.
///
/// A file that changed after it was applied is refused. Concurrent migrators (several
/// workers starting at once) are serialised by an advisory lock, so each file runs once.
public struct Migrator: Sendable {
    /// One migration file.
    public struct Migration: Sendable, Equatable {
        public let version: Int
        public let name: String
        public let sql: String
    }

    /// Why migrating is impossible.
    public struct MigrationError: Error, Equatable, CustomStringConvertible {
        public let description: String
    }

    public let migrations: [Migration]

    /// Loads every `NNNN_name.sql` in `directory`.
    /// - Throws: `MigrationError` for an unreadable directory, a badly named file, or two
    ///   files with the same number.
    public init(directory: String) throws {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: directory) else {
            throw MigrationError(description: "cannot read the migrations directory \(directory) (set --migrations-dir or FCM_MIGRATIONS_DIR)")
        }
        var migrations: [Migration] = []
        for name in names.sorted() where name.hasSuffix(".sql") {
            let stem = name.dropLast(4)
            guard let underscore = stem.firstIndex(of: "_"), let version = Int(stem[..<underscore]),
                  stem[..<underscore].count == 4 else {
                throw MigrationError(description: "migration file \(name) is not named NNNN_name.sql")
            }
            guard let sql = try? String(contentsOfFile: directory + "/" + name, encoding: .utf8) else {
                throw MigrationError(description: "cannot read migration \(name)")
            }
            if migrations.contains(where: { $0.version == version }) {
                throw MigrationError(description: "two migrations are numbered \(version)")
            }
            migrations.append(Migration(version: version, name: String(stem), sql: sql))
        }
        self.migrations = migrations.sorted { $0.version < $1.version }
    }

    /// The migrations directory: `FCM_MIGRATIONS_DIR`, else `./migrations`, else the
    /// `migrations` folder of the source checkout this binary was built from.
    public static func defaultDirectory(environment: [String: String] = ProcessInfo.processInfo.environment) -> String {
        if let configured = environment["FCM_MIGRATIONS_DIR"], !configured.isEmpty { return configured }
        let local = FileManager.default.currentDirectoryPath + "/migrations"
        if FileManager.default.fileExists(atPath: local) { return local }
        let source = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("migrations").path
        return source
    }

    private static let lockKey: Int64 = 0x6663_6D6D  // "fcmm"
    /// The advisory lock's two keys: ours, and the schema migrated into (migrators of
    /// different schemas in one database do not wait for each other).
    private static let lockKeys = "$1::int4, hashtext(current_schema())"

    /// Applies what is pending; returns the names applied, in order.
    @discardableResult
    public func migrate(_ connection: PostgresConnection) async throws -> [String] {
        try await withLock(connection) {
            let applied = try await appliedChecksums(connection)
            try await verify(applied, connection)
            var done: [String] = []
            for migration in migrations where applied[migration.version] == nil {
                try await connection.transaction { tx in
                    try await tx.simpleQuery(migration.sql)
                    try await tx.execute(
                        "INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, encode(sha256(convert_to($3, 'UTF8')), 'hex'))",
                        [.int(Int64(migration.version)), .text(migration.name), .text(migration.sql)])
                }
                done.append(migration.name)
            }
            return done
        }
    }

    /// The migrations not yet applied (after checking the applied ones are unchanged).
    public func pending(_ connection: PostgresConnection) async throws -> [String] {
        let applied = try await appliedChecksums(connection)
        try await verify(applied, connection)
        return migrations.filter { applied[$0.version] == nil }.map(\.name)
    }

    private func withLock<T: Sendable>(_ connection: PostgresConnection, _ body: () async throws -> T) async throws -> T {
        try await connection.execute("SELECT pg_advisory_lock(\(Self.lockKeys))", [.int(Self.lockKey)])
        do {
            let value = try await body()
            try await connection.execute("SELECT pg_advisory_unlock(\(Self.lockKeys))", [.int(Self.lockKey)])
            return value
        } catch {
            _ = try? await connection.execute("SELECT pg_advisory_unlock(\(Self.lockKeys))", [.int(Self.lockKey)])
            throw error
        }
    }

    private func appliedChecksums(_ connection: PostgresConnection) async throws -> [Int: String] {
        try await connection.simpleQuery("""
            CREATE TABLE IF NOT EXISTS schema_migrations (
                version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now())
            """)
        var result: [Int: String] = [:]
        for row in try await connection.query("SELECT version, checksum FROM schema_migrations") {
            if let version = row.int(0), let checksum = row.string(1) { result[Int(version)] = checksum }
        }
        return result
    }

    private func verify(_ applied: [Int: String], _ connection: PostgresConnection) async throws {
        for migration in migrations {
            guard let recorded = applied[migration.version] else { continue }
            let current = try await connection.query("SELECT encode(sha256(convert_to($1, 'UTF8')), 'hex')", [.text(migration.sql)])
                .first?.string(0)
            if current != recorded {
                throw MigrationError(description: "migration \(migration.name).sql changed after it was applied (checksum \(recorded.prefix(12))… now \((current ?? "?").prefix(12))…): restore it and add a new migration instead")
            }
        }
    }
}
