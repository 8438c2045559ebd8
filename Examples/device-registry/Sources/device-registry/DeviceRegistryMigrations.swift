import Worker

/// This application's own tables, compiled in: `migrate` (and `run --migrate`) applies
/// them after the worker's own, recorded in `schema_migrations` as the set
/// `device-registry`.
let deviceRegistryMigrations = MigrationSet(name: "device-registry", migrations: [
    Migration(version: 1, name: "0001_devices", sql: """
        CREATE TABLE devices (
            token         text PRIMARY KEY,
            platform      text NOT NULL,
            registered_at timestamptz NOT NULL
        );
        """),
])
