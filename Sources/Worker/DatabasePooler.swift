/// What sits between the worker and PostgreSQL (`--database-pooler`).
public enum DatabasePooler: String, Sendable, CaseIterable {
    /// PostgreSQL itself, or a pooler that keeps a client on one server connection for its
    /// whole session (PgBouncer's session mode): everything works as on a direct connection.
    case none
    /// A pooler that hands each transaction whichever server connection is free (PgBouncer's
    /// `pool_mode = transaction`). Nothing that outlives a transaction can go through it:
    /// the worker prepares no statements there (each runs as an unnamed one), takes only
    /// transaction-level advisory locks, and sends the outbox's LISTEN and migrations (a
    /// session-level lock) over `--database-direct-url`. Without a direct URL, new outbox
    /// rows are found by the sweep every second instead of by NOTIFY, and `migrate` is
    /// refused.
    case transaction
}
