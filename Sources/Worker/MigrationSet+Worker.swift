internal import WorkerSchema

extension MigrationSet {
    /// The worker's own migrations (`migrations/`), compiled in (module `WorkerSchema`,
    /// written by `scripts/embed-migrations`): no folder is needed for them.
    public static let worker = MigrationSet(name: "fcm-worker", migrations: EmbeddedMigrations.all.map {
        Migration(version: $0.version, name: $0.name, sql: $0.sql)
    })
}
