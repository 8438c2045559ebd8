import FCM
import Foundation
import Outbox
import Postgres

/// What `status` prints: the state of the worker's tables, read in one pass.
struct StatusReport: Sendable {
    struct OutboxGroup: Sendable {
        var transport: String
        var status: String
        var rows: Int
        /// Seconds the oldest due row of the group has waited (nil: none is due).
        var oldestDueAge: Double?
    }

    /// The server `status` reached, and whether it takes writes.
    var database: DatabaseServer
    var pendingMigrations: [String]
    var appliedMigrations: Int
    var outbox: [OutboxGroup]
    /// The transport of rows inserted without one.
    var defaultTransport: String?
    /// Reason → (not replayed, all).
    var deadLetters: [String: (open: Int, all: Int)]
    var tokens: [String: Int]
    /// The transports a worker with the same settings can send (v1 needs a service account).
    var sendableTransports: Set<String> = ["xmpp", "http", "v1"]

    /// Rows still to send over a transport those settings cannot send, by transport.
    var unsendable: [String: Int] {
        var rows: [String: Int] = [:]
        for group in outbox where !sendableTransports.contains(group.transport) && ["pending", "retry", "sending"].contains(group.status) {
            rows[group.transport, default: 0] += group.rows
        }
        return rows
    }

    static func read(from connection: PostgresConnection, migrator: Migrator) async throws -> StatusReport {
        let database = try await DatabaseServer.identify(on: connection)
        let migrations = try await migrator.status(connection)
        let pending = migrations.filter { $0.appliedAt == nil }.map { "\($0.set)/\($0.name)" }
        guard !migrations.contains(where: { $0.set == MigrationSet.worker.name && $0.appliedAt == nil }) else {
            // The worker's tables are not all there yet: only the migrations can be reported.
            return StatusReport(database: database, pendingMigrations: pending, appliedMigrations: migrations.count { $0.appliedAt != nil },
                                outbox: [], defaultTransport: nil, deadLetters: [:], tokens: [:])
        }
        let outbox = try await connection.query("""
            SELECT transport, status, count(*)::bigint, extract(epoch FROM now() - min(available_at) FILTER (WHERE due))::float8
            FROM downstream_messages_shown GROUP BY 1, 2 ORDER BY 1, 2
            """).map { OutboxGroup(transport: $0.string(0) ?? "", status: $0.string(1) ?? "", rows: Int($0.int(2) ?? 0), oldestDueAge: $0.double(3)) }
        var letters: [String: (open: Int, all: Int)] = [:]
        for row in try await connection.query("""
            SELECT reason, count(*) FILTER (WHERE replayed_at IS NULL)::bigint, count(*)::bigint FROM dead_letters GROUP BY reason ORDER BY 1
            """) {
            letters[row.string(0) ?? ""] = (Int(row.int(1) ?? 0), Int(row.int(2) ?? 0))
        }
        var tokens: [String: Int] = [:]
        for row in try await connection.query("SELECT state, count(*)::bigint FROM device_tokens GROUP BY state") {
            tokens[row.string(0) ?? ""] = Int(row.int(1) ?? 0)
        }
        return StatusReport(database: database, pendingMigrations: pending,
                            appliedMigrations: migrations.count { $0.appliedAt != nil },
                            outbox: outbox, defaultTransport: try await OutboxMaintenance.defaultTransport(on: connection),
                            deadLetters: letters, tokens: tokens)
    }

    /// The spool file's size and record count, and those of the journal segments beside it
    /// (read without its lock: a worker may be writing them; a journal segment holds
    /// messages not committed yet, and some that are).
    static func spool(at path: String) -> [String: JSONValue] {
        let data = FileManager.default.contents(atPath: path) ?? Data()
        let segments = UpstreamJournal.segments(beside: path).map { FileManager.default.contents(atPath: $0.path) ?? Data() }
        return ["path": .string(path), "bytes": JSONValue(data.count), "records": JSONValue(data.count { $0 == 0x0A }),
                "journal_segments": JSONValue(segments.count), "journal_bytes": JSONValue(segments.reduce(0) { $0 + $1.count }),
                "journal_records": JSONValue(segments.reduce(0) { $0 + $1.count { $0 == 0x0A } })]
    }

    var json: [String: JSONValue] {
        [
            "database": ["host": .string(database.host), "port": JSONValue(database.port), "read_write": .bool(database.readWrite)],
            "migrations": ["applied": JSONValue(appliedMigrations), "pending": .array(pendingMigrations.map { .string($0) })],
            "outbox": .array(outbox.map { group in
                ["transport": .string(group.transport), "status": .string(group.status), "rows": JSONValue(group.rows),
                 "oldest_due_age_seconds": group.oldestDueAge.map { JSONValue($0) } ?? .null]
            }),
            "default_transport": defaultTransport.map { .string($0) } ?? .null,
            "unsendable": .object(unsendable.mapValues { JSONValue($0) }),
            "dead_letters": .object(deadLetters.mapValues { ["not_replayed": JSONValue($0.open), "all": JSONValue($0.all)] }),
            "tokens": .object(tokens.mapValues { JSONValue($0) }),
        ]
    }

    var text: String {
        var lines: [String] = ["database: \(database)"]
        lines.append(pendingMigrations.isEmpty ? "migrations: \(appliedMigrations) applied, none pending"
                                               : "migrations: \(pendingMigrations.count) PENDING: \(pendingMigrations.joined(separator: ", "))")
        let byDefault = defaultTransport.map { " (rows that name no transport go over \($0))" } ?? ""
        if outbox.isEmpty {
            lines.append("outbox: empty\(byDefault)")
        } else {
            lines.append("outbox:\(byDefault)")
            for group in outbox {
                let due = group.oldestDueAge.map { String(format: ", oldest due %.0f s ago", $0) } ?? ""
                lines.append("  \(group.transport) \(group.status): \(group.rows)\(due)")
            }
            for (transport, rows) in unsendable.sorted(by: { $0.key < $1.key }) {
                lines.append("  UNSENDABLE: \(rows) \(transport) row(s) wait, and a worker with these settings cannot send them "
                             + "(\(transport == "v1" ? "no --service-account-file or GOOGLE_APPLICATION_CREDENTIALS" : "no credentials"))")
            }
        }
        lines.append(deadLetters.isEmpty ? "dead letters: none"
                     : "dead letters: " + deadLetters.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value.open) (\($0.value.all) in all)" }.joined(separator: ", "))
        lines.append(tokens.isEmpty ? "tokens: none marked" : "tokens: " + tokens.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", "))
        return lines.joined(separator: "\n") + "\n"
    }
}
