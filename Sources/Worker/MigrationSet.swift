import Foundation

/// One migration: a numbered SQL text, applied once, in its own transaction.
public struct Migration: Sendable, Equatable {
    public let version: Int
    /// `NNNN_name`, as its file is named.
    public let name: String
    public let sql: String

    public init(version: Int, name: String, sql: String) {
        self.version = version
        self.name = name
        self.sql = sql
    }
}

/// A named, ordered set of migrations: the worker's own (`MigrationSet.worker`, compiled
/// in) and an application's, each recorded under its name in `schema_migrations`, so that
/// their numbers never collide.
public struct MigrationSet: Sendable {
    /// Recorded in `schema_migrations.migration_set`.
    public let name: String
    /// In order of `version`.
    public let migrations: [Migration]

    /// A set compiled into the executable (its SQL as string literals), so that no folder
    /// has to travel with it. Two migrations with one number are refused when the set is
    /// used (`validate()`).
    ///
    /// ```swift
    /// let chatMigrations = MigrationSet(name: "chat", migrations: [
    ///     Migration(version: 1, name: "0001_chats", sql: "CREATE TABLE chats (…);"),
    /// ])
    /// ```
    public init(name: String, migrations: [Migration]) {
        self.name = name
        self.migrations = migrations.sorted { $0.version < $1.version }
    }

    /// - Throws: `MigrationError` when the name is empty or two migrations share a number.
    public func validate() throws(MigrationError) {
        guard !name.isEmpty, !name.contains("/") else {
            throw MigrationError(description: "a migration set needs a name without /")
        }
        var seen = Set<Int>()
        for migration in migrations where !seen.insert(migration.version).inserted {
            throw MigrationError(description: "two migrations of \(name) are numbered \(migration.version)")
        }
    }

    /// The `NNNN_name.sql` files of `directory`. A file identical to one of the worker's own
    /// migrations (an older deployment's copy of `migrations/`) is left out: those are
    /// the worker's, recorded under its set.
    /// - Throws: `MigrationError` for a folder that does not exist or cannot be read, a
    ///   badly named file, or two files with one number.
    public static func directory(_ directory: String, name: String) throws(MigrationError) -> MigrationSet {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: directory, isDirectory: &isDirectory), isDirectory.boolValue,
              let names = try? FileManager.default.contentsOfDirectory(atPath: directory) else {
            throw MigrationError(description: "the migrations folder \(directory) does not exist or cannot be read")
        }
        var migrations: [Migration] = []
        for file in names.sorted() where file.hasSuffix(".sql") {
            let stem = file.dropLast(4)
            guard let underscore = stem.firstIndex(of: "_"), let version = Int(stem[..<underscore]),
                  stem[..<underscore].count == 4 else {
                throw MigrationError(description: "migration file \(file) is not named NNNN_name.sql")
            }
            guard let sql = try? String(contentsOfFile: directory + "/" + file, encoding: .utf8) else {
                throw MigrationError(description: "cannot read migration \(directory)/\(file)")
            }
            let migration = Migration(version: version, name: String(stem), sql: sql)
            if name != MigrationSet.worker.name, MigrationSet.worker.migrations.contains(migration) { continue }
            migrations.append(migration)
        }
        let set = MigrationSet(name: name, migrations: migrations)
        try set.validate()
        return set
    }
}

/// Why migrating is impossible.
public struct MigrationError: Error, Equatable, CustomStringConvertible {
    public let description: String

    public init(description: String) {
        self.description = description
    }
}
