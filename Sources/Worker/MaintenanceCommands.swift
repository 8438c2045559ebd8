import FCM
import Foundation
import Outbox
import Postgres
import Runtime
import Upstream

/// The operator's commands that need the database only: `status`, `dead-letters`,
/// `outbox requeue` and `prune`. None of them connects to FCM. Each takes every setting of
/// `run` (flags and environment variables, the application's own included) besides its own,
/// and builds the application as `run` does: a replay runs the handlers `run` would run.
struct MaintenanceCommands<Application: Sendable>: Sendable {
    /// The settings these commands share.
    struct Settings: Sendable {
        var worker: WorkerConfiguration
        var application: Application
        var json = false
        var all = false
        var statuses: [String] = []
        var since: Duration?
        var olderThan: Duration?
        var limit = 50
    }

    let definition: ApplicationDefinition<Application>

    private var initial: Settings { Settings(worker: definition.initialWorker, application: definition.settings) }

    /// A command's table: its own options, then every setting of `run` (unlisted in help).
    private func table(_ own: [CommandOption<Settings>],
                       finish: @escaping @Sendable (inout Settings) throws(ConfigurationError) -> Void = { settings throws(ConfigurationError) in
                           try requireDatabase(&settings)
                       }) -> OptionTable<Settings> {
        OptionTable(own, unlisted: definition.runOptions(worker: \Settings.worker, application: \Settings.application,
                                                         excluding: Set(own.map(\.flag))),
                    unlistedNote: "It takes every setting of run as well (see help run), and builds the application as run does.",
                    finish: finish)
    }

    private func workerOption(_ flag: String) -> CommandOption<Settings> {
        definition.workerOptions.first { $0.flag == flag }!.lifted(to: \Settings.worker)
    }

    private static func requireDatabase(_ settings: inout Settings) throws(ConfigurationError) {
        guard settings.worker.databaseURL != nil else {
            throw ConfigurationError("missing database URL: pass --database-url or --database-url-file, or set DATABASE_URL")
        }
    }

    private static var json: CommandOption<Settings> { .toggle("--json", help: "print JSON for scripts") { $0.json = $1 } }

    /// `7d`, `48h`, `30m`, `90s` or plain seconds.
    static func parseDuration(_ text: String, name: String) throws(ConfigurationError) -> Duration {
        let units: [Character: Double] = ["s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800]
        var number = Substring(text), scale = 1.0
        if let last = text.last, let unit = units[last] {
            number = text.dropLast()
            scale = unit
        }
        guard let value = Double(number), value > 0, value * scale <= 3_650 * 86_400 else {
            throw ConfigurationError("invalid \(name) \(text): expected a duration such as 7d, 48h, 30m or 90s")
        }
        return .milliseconds(Int64(value * scale * 1000))
    }

    /// Connects for a one-off command (no prepared statements, no call deadline) and runs `body`.
    private static func withDatabase<T>(_ settings: Settings, _ body: (PostgresConnection) async throws -> T) async throws -> T {
        try await PostgresConnection.withConnection(settings.worker.databaseURL!, callTimeout: nil, preparesStatements: false, body)
    }

    /// Runs a command's body and turns its errors into exit statuses (2 for settings, 1 otherwise).
    private static func running(_ name: String, _ context: WorkerCommandContext, _ body: () async throws -> Void) async -> Int32 {
        do {
            try await body()
            return 0
        } catch let error as ConfigurationError {
            return context.fail("\(name): \(error.description)")
        } catch let error as MigrationError {
            return context.fail("\(name): \(error.description)")
        } catch let error as PostgresError where error.kind == .configuration {
            return context.fail("\(name): \(error.description)")
        } catch {
            return context.fail("\(name): \(error)", status: 1)
        }
    }

    private static func print(json value: JSONValue) {
        Swift.print(value.serialized)
    }

    // MARK: - status

    /// `status`: what the database says about the worker.
    var statusCommand: WorkerCommand {
        let options = table([workerOption("--database-url"), workerOption("--database-url-file"), workerOption("--migrations-dir"), workerOption("--spool-file"),
                             workerOption("--service-account-file"), Self.json])
        let initial = self.initial
        return WorkerCommand(name: "status", summary: "print pending migrations, the outbox by transport and status, dead letters, "
                                 + "token states and the spool (database only; --json for scripts)",
                             options: options.help, optionsMarkdown: options.markdownTable) { [initial] arguments, context in
            var status: Int32 = 0
            guard let (settings, positional) = context.parse(arguments, with: options, into: initial, status: &status) else { return status }
            if let extra = positional.first { return context.fail("status: unexpected argument \(extra)") }
            return await Self.running("status", context) {
                let migrator = try settings.worker.migrator()
                var report = try await Self.withDatabase(settings) { try await StatusReport.read(from: $0, migrator: migrator) }
                // Rows a worker with these settings could not send: v1 without a service account
                // (the command is not told the CCS connections or the server key).
                report.sendableTransports = settings.worker.serviceAccountFile == nil ? ["xmpp", "http"] : ["xmpp", "http", "v1"]
                let spool = StatusReport.spool(at: settings.worker.spoolFile)
                if settings.json {
                    var object = report.json
                    object["spool"] = .object(spool)
                    Self.print(json: .object(object))
                } else {
                    Swift.print(report.text + "spool: \(spool["path"]?.stringValue ?? "") holds \(spool["records"]?.intValue ?? 0) record(s), "
                                + "\(spool["bytes"]?.intValue ?? 0) bytes; its journal \(spool["journal_segments"]?.intValue ?? 0) segment(s), "
                                + "\(spool["journal_records"]?.intValue ?? 0) record(s)\n", terminator: "")
                }
            }
        }
    }

    // MARK: - dead-letters

    /// `dead-letters list|replay`.
    var deadLettersCommand: WorkerCommand {
        let options = table([
            workerOption("--database-url"), workerOption("--database-url-file"), workerOption("--handlers"), workerOption("--max-attempts"), Self.json,
            .toggle("--all", help: "replay: every dead letter not replayed yet that handlers can take") { $0.all = $1 },
            .integer("--limit", environment: nil, default: "50", help: "list: at most this many, newest first", name: "limit",
                     range: 1...100_000, \.limit),
        ])
        let (initial, definition) = (self.initial, self.definition)
        return WorkerCommand(name: "dead-letters", synopsis: "list | replay ID... | replay --all [options]",
                             summary: "list dead letters, or run dead-lettered messages through the handlers again (exactly once)",
                             options: options.help, optionsMarkdown: options.markdownTable) { arguments, context in
            var status: Int32 = 0
            guard let (settings, positional) = context.parse(arguments, with: options, into: initial, status: &status) else { return status }
            switch positional.first {
            case "list":
                return await Self.running("dead-letters", context) {
                    let letters = try await Self.withDatabase(settings) { try await DeadLetterReplay.list(on: $0, limit: settings.limit) }
                    if settings.json {
                        Self.print(json: .array(letters.map(\.json)))
                    } else {
                        for letter in letters { Swift.print(letter.line) }
                        if letters.isEmpty { Swift.print("no dead letters") }
                    }
                }
            case "replay":
                let ids = positional.dropFirst().compactMap { Int64($0) }
                guard ids.count == positional.count - 1 else { return context.fail("dead-letters: replay takes dead letter ids (numbers) or --all") }
                guard settings.all != !ids.isEmpty else { return context.fail("dead-letters: replay takes ids or --all (one of them)") }
                return await Self.running("dead-letters", context) {
                    var worker = settings.worker
                    let chosen = try definition.handlers(for: &worker, application: settings.application)
                    let replay = DeadLetterReplay(configuration: worker, handlers: chosen,
                                                  logger: Logger(label: context.program, minimumLevel: .warning))
                    let outcome = try await replay.run(ids: settings.all ? nil : ids)
                    if settings.json {
                        Self.print(json: ["replayed": .array(outcome.replayed.map { JSONValue(Int($0)) }),
                                     "dead_lettered_again": .array(outcome.failedAgain.map { JSONValue(Int($0)) }),
                                     "skipped": .array(outcome.skipped.map { ["id": JSONValue(Int($0.id)), "reason": .string($0.reason)] })])
                    } else {
                        Swift.print("replayed \(outcome.replayed.count), dead-lettered again \(outcome.failedAgain.count), skipped \(outcome.skipped.count)")
                        for skip in outcome.skipped { Swift.print("  skipped \(skip.id): \(skip.reason)") }
                    }
                }
            default:
                return context.fail("dead-letters: expected list or replay (see \(context.program) help dead-letters)")
            }
        }
    }

    // MARK: - outbox requeue

    /// `outbox requeue --status failed|expired [--since DURATION]`.
    var outboxCommand: WorkerCommand {
        let options = table([
            workerOption("--database-url"), workerOption("--database-url-file"), Self.json,
            CommandOption("--status", placeholder: "failed|expired", default: "required",
                          help: "which finished rows to send again (both: failed,expired)") { settings, text throws(ConfigurationError) in
                let statuses = text.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
                guard !statuses.isEmpty, statuses.allSatisfy({ ["failed", "expired"].contains($0) }) else {
                    throw ConfigurationError("invalid --status \(text): expected failed, expired or failed,expired")
                }
                settings.statuses = statuses
            },
            CommandOption("--since", placeholder: "DURATION", default: "all time",
                          help: "only rows created this recently (7d, 48h, 30m, 90s)") { settings, text throws(ConfigurationError) in
                settings.since = try Self.parseDuration(text, name: "--since")
            },
        ])
        let initial = self.initial
        return WorkerCommand(name: "outbox", synopsis: "requeue --status failed|expired [--since DURATION] [options], or default-transport [xmpp|http|v1] [options]",
                             summary: "requeue: send finished outbox rows again (their status back to pending, their attempts to 0); "
                                + "default-transport: show or set the transport of rows inserted without one (xmpp until set)",
                             options: options.help, optionsMarkdown: options.markdownTable) { arguments, context in
            var status: Int32 = 0
            guard let (settings, positional) = context.parse(arguments, with: options, into: initial, status: &status) else { return status }
            if positional.first == "default-transport" {
                guard positional.count <= 2 else { return context.fail("outbox default-transport: expected at most one of xmpp, http, v1") }
                let chosen = positional.dropFirst().first
                if let chosen, !["xmpp", "http", "v1"].contains(chosen) {
                    return context.fail("outbox default-transport: \(chosen) is not a transport: expected xmpp, http or v1")
                }
                return await Self.running("outbox", context) {
                    let current = try await Self.withDatabase(settings) { connection in
                        if let chosen { try await OutboxMaintenance.setDefaultTransport(chosen, on: connection) }
                        return try await OutboxMaintenance.defaultTransport(on: connection)
                    }
                    if settings.json { Self.print(json: ["default_transport": .string(current)]) } else { Swift.print("default transport: \(current)") }
                }
            }
            guard positional == ["requeue"] else { return context.fail("outbox: expected requeue or default-transport (see \(context.program) help outbox)") }
            guard !settings.statuses.isEmpty else { return context.fail("outbox: requeue needs --status failed, expired or failed,expired") }
            return await Self.running("outbox", context) {
                let count = try await Self.withDatabase(settings) { try await OutboxMaintenance.requeue(statuses: settings.statuses, since: settings.since, on: $0) }
                if settings.json { Self.print(json: ["requeued": JSONValue(count)]) } else { Swift.print("requeued \(count) row(s)") }
            }
        }
    }

    // MARK: - prune

    /// `prune --older-than DURATION`.
    var pruneCommand: WorkerCommand {
        let options = table([
            workerOption("--database-url"), workerOption("--database-url-file"), Self.json,
            CommandOption("--older-than", placeholder: "DURATION", default: "required",
                          help: "delete rows older than this (at least 1h; keep processed_upstream longer than CCS may redeliver: days)") { settings, text throws(ConfigurationError) in
                let age = try Self.parseDuration(text, name: "--older-than")
                guard age >= .seconds(3600) else { throw ConfigurationError("--older-than \(text) is under an hour: CCS may still redeliver such messages") }
                settings.olderThan = age
            },
        ]) { settings throws(ConfigurationError) in
            try Self.requireDatabase(&settings)
            guard settings.olderThan != nil else { throw ConfigurationError("missing --older-than DURATION (such as 14d)") }
        }
        let initial = self.initial
        return WorkerCommand(name: "prune", synopsis: "--older-than DURATION [options]",
                             summary: "delete old processed_upstream records, finished outbox rows and dead letters, in small batches",
                             options: options.help, optionsMarkdown: options.markdownTable) { arguments, context in
            var status: Int32 = 0
            guard let (settings, positional) = context.parse(arguments, with: options, into: initial, status: &status) else { return status }
            if let extra = positional.first { return context.fail("prune: unexpected argument \(extra)") }
            return await Self.running("prune", context) {
                let deleted = try await Self.withDatabase(settings) { try await OutboxMaintenance.prune(olderThan: settings.olderThan!, on: $0) }
                if settings.json {
                    Self.print(json: .object(deleted.mapValues { JSONValue($0) }))
                } else {
                    Swift.print(deleted.sorted { $0.key < $1.key }.map { "\($0.key): \($0.value) row(s) deleted" }.joined(separator: "\n"))
                }
            }
        }
    }
}
