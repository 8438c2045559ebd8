import Foundation
import Postgres
import Runtime
import Upstream
import Synchronization
import Transport
import XMPP

/// The entry point of a worker executable: the subcommands (`run`, `migrate`,
/// `migrate status`, `help`, plus the executable's own), their `--help`, `--version`, and exit statuses. A team's
/// own executable is:
///
/// ```swift
/// import Worker
/// import Handlers
///
/// var handlers = UpstreamHandlers()
/// handlers.register("store", StoreHandler())
/// handlers.register("register", RegisterDevice(), for: .when { $0.data["action"] == "register" })
/// exit(await WorkerMain.run(handlers: handlers))
/// ```
///
/// Its messages start with its own name; `--handlers a,b` selects among the registered
/// handlers by name (all of them by default). A first argument that is an option (`--sender-id …`)
/// means `run`.
public enum WorkerMain {
    /// This release.
    public static let version = "0.10.0"

    /// Exit statuses: 0 after SIGTERM/SIGINT (graceful shutdown) and for `help`, 2 for a
    /// missing or invalid setting or pending migrations, 3 when FCM refuses the credentials
    /// or certificate (or the XMPP domain), 1 otherwise.
    ///
    /// - Parameters:
    ///   - handlers: every handler the executable offers; `--handlers` selects among them.
    ///   - defaultHandlers: the ones run when `--handlers` is not given (nil: all).
    ///   - migrations: the application's migration sets, applied after the worker's own by
    ///     `migrate` and `run --migrate` (`MigrationSet.embedded` or `.directory`).
    ///   - commands: the executable's own subcommands, next to `run` and `migrate`.
    public static func run(handlers: UpstreamHandlers, defaultHandlers: [String]? = nil, migrations: [MigrationSet] = [],
                           commands: [WorkerCommand] = [], program: String? = nil,
                           arguments: [String] = Array(CommandLine.arguments.dropFirst()),
                           environment: [String: String] = ProcessInfo.processInfo.environment) async -> Int32 {
        await run(settings: NoSettings(), options: [], defaultHandlers: defaultHandlers, migrations: migrations, commands: commands,
                  program: program, arguments: arguments, environment: environment) { _ in handlers }
    }

    /// Settings for an executable that adds none.
    public struct NoSettings: Sendable {
        public init() {}
    }

    /// `run(handlers:…)` for handlers that take settings of their own: `options` join the
    /// option table of `run` (their flags, environment variables, defaults and help appear
    /// in `help run`), are parsed into `settings`, and `makeHandlers` builds the handlers
    /// from the result. `makeHandlers` is also called with the defaults, for the names
    /// `help` lists: it must not fail on them.
    ///
    /// ```swift
    /// struct ChatSettings: Sendable { var historyLimit = 50 }
    /// exit(await WorkerMain.run(settings: ChatSettings(), options: [
    ///     .integer("--chat-history", environment: "CHAT_HISTORY", default: "50", help: "messages kept per chat",
    ///              name: "chat history", range: 1...10_000, \.historyLimit),
    /// ]) { settings in
    ///     var handlers = UpstreamHandlers()
    ///     handlers.register("chat", ChatHandler(historyLimit: settings.historyLimit), for: .category("chat"))
    ///     return handlers
    /// })
    /// ```
    public static func run<Settings: Sendable>(settings: Settings, options: [CommandOption<Settings>],
                                               defaultHandlers: [String]? = nil, migrations: [MigrationSet] = [],
                                               commands: [WorkerCommand] = [], program: String? = nil,
                                               arguments: [String] = Array(CommandLine.arguments.dropFirst()),
                                               environment: [String: String] = ProcessInfo.processInfo.environment,
                                               handlers makeHandlers: @escaping @Sendable (Settings) -> UpstreamHandlers) async -> Int32 {
        // Before anything uses OpenSSL (libpq included): no cleanup at exit under live threads.
        TLSContext.initializeForProcess()
        let program = program ?? URL(fileURLWithPath: CommandLine.arguments.first ?? "fcm-worker").lastPathComponent
        let context = WorkerCommandContext(program: program, environment: environment)
        let definition = ApplicationDefinition(settings: settings, options: options, defaultHandlers: defaultHandlers,
                                               migrations: migrations, makeHandlers: makeHandlers)
        let names = definition.handlerNames
        let maintenance = MaintenanceCommands(definition: definition)
        let all = [runCommand(definition), migrateCommand(definition), maintenance.statusCommand, maintenance.deadLettersCommand,
                   maintenance.outboxCommand, maintenance.pruneCommand] + commands
        var arguments = arguments
        if let first = arguments.first, first.hasPrefix("--"), !["--help", "--version"].contains(first) {
            arguments.insert("run", at: 0)
        }
        guard let name = arguments.first else {
            print(overview(program: program, commands: all, handlerNames: names), terminator: "")
            return 0
        }
        switch name {
        case "--version", "version":
            print("\(program) \(version)")
            return 0
        case "--help", "-h", "help":
            if let topic = arguments.dropFirst().first {
                guard let command = all.first(where: { $0.name == topic }) else {
                    return context.fail("no command \(topic) (see \(program) help)")
                }
                if arguments.dropFirst(2).first == "--markdown" {
                    print(command.optionsMarkdown)
                } else {
                    print(command.help(program: program), terminator: "")
                }
            } else {
                print(overview(program: program, commands: all, handlerNames: names), terminator: "")
            }
            return 0
        default:
            guard let command = all.first(where: { $0.name == name }) else {
                return context.fail("unknown command \(name) (see \(program) help)")
            }
            var running = context
            running.command = command
            return await command.run(Array(arguments.dropFirst()), running)
        }
    }

    /// `PROGRAM help`: the commands and where to read more.
    static func overview(program: String, commands: [WorkerCommand], handlerNames: [String]) -> String {
        let width = (commands.map { $0.name.count }.max() ?? 0) + 4
        var text = "usage: \(program) COMMAND [options]   (\(program) \(version))\n\ncommands:\n"
        for command in commands {
            text += "  " + command.name.padding(toLength: width, withPad: " ", startingAt: 0) + command.summary + "\n"
        }
        text += "  " + "help COMMAND".padding(toLength: width, withPad: " ", startingAt: 0) + "a command's options, environment variables and defaults\n"
        text += "\nhandlers: \(handlerNames.joined(separator: ", "))\n"
        text += """

            Flags win over environment variables. Exit status: 0 after SIGTERM/SIGINT, 2 for a
            missing or invalid setting or pending migrations, 3 when FCM refuses the credentials,
            the certificate or the XMPP domain, 1 otherwise.

            """
        return text
    }

    /// The settings of `run`: the worker's and the executable's own.
    struct RunSettings<Settings: Sendable>: Sendable {
        var worker: WorkerConfiguration
        var application: Settings
    }

    /// `run`: connect to CCS, ack upstream messages, run the handlers, send the outbox.
    static func runCommand<Settings: Sendable>(_ definition: ApplicationDefinition<Settings>) -> WorkerCommand {
        let finishWorker = WorkerConfiguration.options.finish
        let options = OptionTable<RunSettings<Settings>>(
            definition.runOptions(worker: \RunSettings<Settings>.worker, application: \RunSettings<Settings>.application)
        ) { settings throws(ConfigurationError) in
            try finishWorker(&settings.worker)
        }
        let start = RunSettings(worker: definition.initialWorker, application: definition.settings)
        return WorkerCommand(name: "run", summary: "connect to CCS, ack upstream messages, run the handlers, send the outbox",
                             options: options.help, optionsMarkdown: options.markdownTable) { arguments, context in
            var status: Int32 = 0
            guard let (parsed, positional) = context.parse(arguments, with: options, into: start, status: &status) else { return status }
            if let extra = positional.first { return context.fail("unexpected argument \(extra) (see \(context.program) help run)") }
            var configuration = parsed.worker
            configuration.warnings += WorkerConfiguration.secretsInArguments(arguments)
            let handlers: UpstreamHandlers
            do throws(ConfigurationError) {
                handlers = try definition.handlers(for: &configuration, application: parsed.application)
            } catch {
                return context.fail(error.description)
            }
            return await serve(configuration, handlers: handlers, context: context)
        }
    }

    /// Runs the worker until SIGTERM/SIGINT and turns the outcome into an exit status.
    static func serve(_ configuration: WorkerConfiguration, handlers: UpstreamHandlers, context: WorkerCommandContext) async -> Int32 {
        let worker = FCMWorker(configuration: configuration, handlers: handlers,
                               logger: Logger(label: context.program, minimumLevel: configuration.logLevel, format: configuration.logFormat))
        // SIGHUP: take the credentials again (the service-account key file); never ends the process.
        let reload = SignalTrap([SIGHUP]) { _ in worker.reloadCredentials() }
        defer { withExtendedLifetime(reload) {} }
        for warning in configuration.warnings { worker.logger.warning(warning) }
        worker.logger.info("handlers: \(handlers.names.joined(separator: ", "))")
        let signals = Atomic(0)
        // The first signal starts the graceful shutdown; a second one skips the waiting.
        let trap = SignalTrap { signal in
            let name = signal == SIGTERM ? "SIGTERM" : "SIGINT"
            if signals.add(1, ordering: .relaxed).newValue == 1 {
                worker.logger.info("received \(name), shutting down (send it again to skip the waiting)")
            } else {
                worker.logger.warning("received \(name) again: spooling what is uncommitted and stopping now")
            }
            worker.requestShutdown()
        }
        defer { withExtendedLifetime(trap) {} }
        let outcome: Result<Void, any Error>
        do {
            try await worker.run()
            outcome = .success(())
        } catch {
            outcome = .failure(error)
        }
        switch outcome {
        case .success:
            return 0
        case .failure(let error as XMPPError) where error.isConfigurationError:
            return context.fail("\(error)", status: 3)
        case .failure(let error as ServiceAccountRefused):
            return context.fail(error.description, status: 3)
        case .failure(let error as ConfigurationError):
            return context.fail(error.description)
        case .failure(let error as MigrationError):
            return context.fail(error.description)
        case .failure(let error as PostgresError) where error.kind == .configuration:
            return context.fail(error.description)
        case .failure(let error):
            return context.fail("\(error)", status: 1)
        }
    }

    /// `migrate`: apply the pending migrations; `migrate status`: list every migration
    /// of every set with when it was applied.
    static func migrateCommand<Settings: Sendable>(_ definition: ApplicationDefinition<Settings>) -> WorkerCommand {
        let own: Set<String> = ["--database-url-file", "--database-url", "--migrations-dir"]
        let options = OptionTable<RunSettings<Settings>>(
            definition.runOptions(worker: \RunSettings<Settings>.worker, application: \RunSettings<Settings>.application)
                .filter { own.contains($0.flag) },
            unlisted: definition.runOptions(worker: \RunSettings<Settings>.worker, application: \RunSettings<Settings>.application,
                                            excluding: own),
            unlistedNote: "It takes every setting of run as well (see help run)."
        ) { settings throws(ConfigurationError) in
            guard settings.worker.databaseURL != nil else {
                throw ConfigurationError("missing database URL: pass --database-url or --database-url-file, or set DATABASE_URL")
            }
        }
        let initial = RunSettings(worker: definition.initialWorker, application: definition.settings)
        return WorkerCommand(name: "migrate", synopsis: "[status] [options]",
                             summary: "apply pending database migrations (the worker's, then the application's), each in its own transaction; status lists them",
                             options: options.help, optionsMarkdown: options.markdownTable) { arguments, context in
            var status: Int32 = 0
            guard let (parsed, positional) = context.parse(arguments, with: options, into: initial, status: &status) else { return status }
            let configuration = parsed.worker
            let listing = positional.first == "status"
            if let extra = positional.dropFirst(listing ? 1 : 0).first { return context.fail("migrate: unexpected argument \(extra)") }
            do {
                let migrator = try configuration.migrator()
                // A one-off command gains nothing from prepared statements, and then works
                // behind any pooler; a migration may take long (no call deadline).
                // Migrations hold a session-level lock, which a transaction pooler cannot carry.
                guard let url = listing ? configuration.databaseURL : configuration.sessionDatabaseURL else {
                    throw ConfigurationError("behind a transaction pooler (--database-pooler transaction), migrate needs --database-direct-url: migrations hold a session-level lock")
                }
                let output = try await PostgresConnection.withConnection(url, callTimeout: nil,
                                                                         preparesStatements: false) { connection in
                    if listing { return statusTable(try await migrator.status(connection)) }
                    let applied = try await migrator.migrate(connection)
                    let sets = migrator.sets.map { "\($0.name) \($0.migrations.count)" }.joined(separator: ", ")
                    return (applied.isEmpty ? "the database is up to date (\(sets) migration(s))"
                                            : "applied: \(applied.joined(separator: ", "))") + "\n"
                }
                print(output, terminator: "")
                return 0
            } catch let error as ConfigurationError {
                return context.fail("migrate: \(error.description)")
            } catch let error as MigrationError {
                return context.fail("migrate: \(error.description)")
            } catch let error as PostgresError where error.kind == .configuration {
                return context.fail("migrate: \(error.description)")
            } catch {
                return context.fail("migrate: \(error)", status: 1)
            }
        }
    }

    /// `migrate status`'s lines: set, migration, and when it was applied or `pending`.
    static func statusTable(_ rows: [Migrator.Status]) -> String {
        let setWidth = max(3, rows.map(\.set.count).max() ?? 0) + 2
        let nameWidth = max(9, rows.map(\.name.count).max() ?? 0) + 2
        let format = Date.ISO8601FormatStyle()
        var text = "set".padding(toLength: setWidth, withPad: " ", startingAt: 0)
            + "migration".padding(toLength: nameWidth, withPad: " ", startingAt: 0) + "applied\n"
        for row in rows {
            text += row.set.padding(toLength: setWidth, withPad: " ", startingAt: 0)
                + row.name.padding(toLength: nameWidth, withPad: " ", startingAt: 0)
                + (row.appliedAt.map { format.format($0) } ?? "pending") + "\n"
        }
        return text
    }

    /// Writes `fcm-worker: LINE` to standard error.
    public static func printError(_ line: String) {
        WorkerCommandContext(program: "fcm-worker", environment: [:]).printError(line)
    }
}
