import Foundation
import Postgres

/// Applies migration sets in order, each migration in its own transaction, and records
/// each with a SHA-256 checksum in `schema_migrations` under its set's name.
///
/// A migration that changed after it was applied is refused. Concurrent migrators (several
/// workers starting at once) are serialised by an advisory lock, so each runs once.
public struct Migrator: Sendable {
    /// For callers that name the error type through the migrator.
    public typealias MigrationError = Worker.MigrationError

    /// In the order they apply: the worker's own set first.
    public let sets: [MigrationSet]

    public init(sets: [MigrationSet]) {
        self.sets = sets
    }

    /// Every migration of every set, in order.
    public var migrations: [Migration] { sets.flatMap(\.migrations) }

    private static let lockKey: Int64 = 0x6663_6D6D  // "fcmm"
    /// The advisory lock's two keys: ours, and the schema migrated into (migrators of
    /// different schemas in one database do not wait for each other).
    private static let lockKeys = "$1::int4, hashtext(current_schema())"

    /// Applies what is pending; returns the migrations applied (`set/NNNN_name`), in order.
    @discardableResult
    public func migrate(_ connection: PostgresConnection) async throws -> [String] {
        try validate()
        return try await withLock(connection) {
            let applied = try await appliedChecksums(connection)
            try await verify(applied, connection)
            let pending = sets.flatMap { set in
                set.migrations.filter { applied[Key(set: set.name, version: $0.version)] == nil }.map { (set, $0) }
            }
            // Refused before any runs: each runs in one transaction of the migrator's.
            for (set, migration) in pending {
                if let keyword = MigrationScript.transactionControlStatement(in: migration.sql) {
                    throw MigrationError(description: "migration \(Self.label(set, migration)) holds a \(keyword) statement: each migration "
                                         + "runs in one transaction the migrator opens and commits; remove it (nothing was applied)")
                }
            }
            var done: [String] = []
            for (set, migration) in pending {
                do {
                    try await connection.transaction { tx in
                        try await tx.simpleQuery(migration.sql)
                        // Still in the migrator's transaction (a SAVEPOINT fails outside one).
                        try await tx.simpleQuery("SAVEPOINT fcm_migration_check; RELEASE SAVEPOINT fcm_migration_check")
                        try await tx.execute("""
                            INSERT INTO schema_migrations (migration_set, version, name, checksum)
                            VALUES ($1, $2, $3, encode(sha256(convert_to($4, 'UTF8')), 'hex'))
                            """, [.text(set.name), .int(Int64(migration.version)), .text(migration.name), .text(migration.sql)])
                    }
                } catch let error as PostgresError where error.kind != .connection {
                    let applied = done.isEmpty ? "none applied" : "applied before it: \(done.joined(separator: ", "))"
                    throw MigrationError(description: "migration \(Self.label(set, migration)) failed and was rolled back "
                                         + "(\(applied)): \(error.message)")
                }
                done.append(Self.label(set, migration))
            }
            return done
        }
    }

    /// The migrations not yet applied (`set/NNNN_name`), after checking the applied ones
    /// are unchanged.
    public func pending(_ connection: PostgresConnection) async throws -> [String] {
        try await status(connection).filter { $0.appliedAt == nil }.map { "\($0.set)/\($0.name)" }
    }

    /// One migration's state.
    public struct Status: Sendable, Equatable {
        public let set: String
        public let version: Int
        public let name: String
        /// Nil while pending.
        public let appliedAt: Date?
    }

    /// Every migration of every set with when it was applied (after checking the applied
    /// ones are unchanged).
    public func status(_ connection: PostgresConnection) async throws -> [Status] {
        try validate()
        let applied = try await appliedChecksums(connection)
        try await verify(applied, connection)
        var times: [Key: Date] = [:]
        for row in try await connection.query("SELECT migration_set, version, extract(epoch FROM applied_at)::float8 FROM schema_migrations") {
            if let set = row.string(0), let version = row.int(1), let seconds = row.double(2) {
                times[Key(set: set, version: Int(version))] = Date(timeIntervalSince1970: seconds)
            }
        }
        return sets.flatMap { set in
            set.migrations.map { Status(set: set.name, version: $0.version, name: $0.name,
                                        appliedAt: times[Key(set: set.name, version: $0.version)]) }
        }
    }

    /// - Throws: `MigrationError` for a set that is invalid or two sets with one name.
    private func validate() throws(MigrationError) {
        var names = Set<String>()
        for set in sets {
            try set.validate()
            guard names.insert(set.name).inserted else {
                throw MigrationError(description: "two migration sets are named \(set.name)")
            }
        }
    }

    private struct Key: Hashable {
        let set: String
        let version: Int
    }

    private static func label(_ set: MigrationSet, _ migration: Migration) -> String {
        set.name == MigrationSet.worker.name ? migration.name : "\(set.name)/\(migration.name)"
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

    /// The recorded checksums, after making `schema_migrations` hold migration sets (a
    /// table from before sets gets the column, its rows counted as the worker's).
    private func appliedChecksums(_ connection: PostgresConnection) async throws -> [Key: String] {
        try await connection.simpleQuery("""
            CREATE TABLE IF NOT EXISTS schema_migrations (
                migration_set text NOT NULL DEFAULT 'fcm-worker', version integer NOT NULL, name text NOT NULL,
                checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now(),
                PRIMARY KEY (migration_set, version));
            ALTER TABLE schema_migrations ADD COLUMN IF NOT EXISTS migration_set text NOT NULL DEFAULT 'fcm-worker';
            DO $$
            BEGIN
                IF (SELECT indnatts FROM pg_index WHERE indrelid = 'schema_migrations'::regclass AND indisprimary) = 1 THEN
                    ALTER TABLE schema_migrations DROP CONSTRAINT schema_migrations_pkey,
                        ADD PRIMARY KEY (migration_set, version);
                END IF;
            END $$;
            """)
        var result: [Key: String] = [:]
        for row in try await connection.query("SELECT migration_set, version, checksum FROM schema_migrations") {
            if let set = row.string(0), let version = row.int(1), let checksum = row.string(2) {
                result[Key(set: set, version: Int(version))] = checksum
            }
        }
        // Before sets, an application's migrations shared the worker's folder and were
        // recorded as the worker's: one recorded under the worker's set with a number the
        // worker does not use, and the checksum of an application migration of that
        // number, is that application's. It moves to its set (and is not applied again).
        let workerName = MigrationSet.worker.name
        let workerVersions = Set(MigrationSet.worker.migrations.map(\.version))
        for set in sets where set.name != workerName {
            for migration in set.migrations where result[Key(set: set.name, version: migration.version)] == nil
                && !workerVersions.contains(migration.version) {
                guard let recorded = result[Key(set: workerName, version: migration.version)],
                      try await checksum(migration.sql, connection) == recorded else { continue }
                try await connection.execute("UPDATE schema_migrations SET migration_set = $1 WHERE migration_set = $2 AND version = $3",
                                             [.text(set.name), .text(workerName), .int(Int64(migration.version))])
                result[Key(set: workerName, version: migration.version)] = nil
                result[Key(set: set.name, version: migration.version)] = recorded
            }
        }
        return result
    }

    private func checksum(_ sql: String, _ connection: PostgresConnection) async throws -> String? {
        try await connection.query("SELECT encode(sha256(convert_to($1, 'UTF8')), 'hex')", [.text(sql)]).first?.string(0)
    }

    private func verify(_ applied: [Key: String], _ connection: PostgresConnection) async throws {
        for set in sets {
            for migration in set.migrations {
                guard let recorded = applied[Key(set: set.name, version: migration.version)] else { continue }
                let current = try await checksum(migration.sql, connection)
                if current != recorded {
                    throw MigrationError(description: "migration \(Self.label(set, migration)) changed after it was applied (checksum \(recorded.prefix(12))… now \((current ?? "?").prefix(12))…): restore it and add a new migration instead")
                }
            }
        }
    }
}
