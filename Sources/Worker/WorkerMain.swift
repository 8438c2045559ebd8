import Foundation
import Postgres
import Runtime
import Synchronization
import XMPP

/// The entry point of a worker executable: the subcommands (`run`, `migrate`, `help`,
/// plus the executable's own), their `--help`, `--version`, and exit statuses. A team's
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
    public static let version = "0.9.0"

    /// Exit statuses: 0 after SIGTERM/SIGINT (graceful shutdown) and for `help`, 2 for a
    /// missing or invalid setting or pending migrations, 3 when FCM refuses the credentials
    /// or certificate (or the XMPP domain), 1 otherwise.
    public static func run(handlers: UpstreamHandlers, defaultHandlers: [String]? = nil, commands: [WorkerCommand] = [],
                           program: String? = nil,
                           arguments: [String] = Array(CommandLine.arguments.dropFirst()),
                           environment: [String: String] = ProcessInfo.processInfo.environment) async -> Int32 {
        let program = program ?? URL(fileURLWithPath: CommandLine.arguments.first ?? "fcm-worker").lastPathComponent
        let context = WorkerCommandContext(program: program, environment: environment)
        let all = [runCommand(handlers: handlers, defaultHandlers: defaultHandlers), migrateCommand] + commands
        var arguments = arguments
        if let first = arguments.first, first.hasPrefix("--"), !["--help", "--version"].contains(first) {
            arguments.insert("run", at: 0)
        }
        guard let name = arguments.first else {
            print(overview(program: program, commands: all, handlers: handlers), terminator: "")
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
                print(overview(program: program, commands: all, handlers: handlers), terminator: "")
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
    static func overview(program: String, commands: [WorkerCommand], handlers: UpstreamHandlers) -> String {
        let width = (commands.map { $0.name.count }.max() ?? 0) + 4
        var text = "usage: \(program) COMMAND [options]   (\(program) \(version))\n\ncommands:\n"
        for command in commands {
            text += "  " + command.name.padding(toLength: width, withPad: " ", startingAt: 0) + command.summary + "\n"
        }
        text += "  " + "help COMMAND".padding(toLength: width, withPad: " ", startingAt: 0) + "a command's options, environment variables and defaults\n"
        text += "\nhandlers: \(handlers.names.joined(separator: ", "))\n"
        text += """

            Flags win over environment variables. Exit status: 0 after SIGTERM/SIGINT, 2 for a
            missing or invalid setting or pending migrations, 3 when FCM refuses the credentials,
            the certificate or the XMPP domain, 1 otherwise.

            """
        return text
    }

    /// `run`: connect to CCS, ack upstream messages, run the handlers, send the outbox.
    static func runCommand(handlers available: UpstreamHandlers, defaultHandlers: [String]?) -> WorkerCommand {
        var table = WorkerConfiguration.options
        if let index = table.options.firstIndex(where: { $0.flag == "--handlers" }) {
            let chosen = defaultHandlers ?? available.names
            table.options[index] = CommandOption("--handlers", environment: "FCM_HANDLERS", placeholder: "a,b",
                                                 default: chosen.joined(separator: ","),
                                                 help: "handlers to run, of: \(available.names.joined(separator: ", "))",
                                                 apply: table.options[index].apply)
        }
        let options = table
        return WorkerCommand(name: "run", summary: "connect to CCS, ack upstream messages, run the handlers, send the outbox",
                             options: options.help, optionsMarkdown: options.markdownTable) { arguments, context in
            var status: Int32 = 0
            guard let (parsed, positional) = context.parse(arguments, with: options, into: WorkerConfiguration(senderID: "", serverKey: ""),
                                                           status: &status) else { return status }
            if let extra = positional.first { return context.fail("unexpected argument \(extra) (see \(context.program) help run)") }
            var configuration = parsed
            let handlers: UpstreamHandlers
            do throws(ConfigurationError) {
                let names = configuration.handlers ?? defaultHandlers ?? available.names
                configuration.handlers = names
                handlers = try available.selecting(names)
            } catch {
                return context.fail(error.description)
            }
            return await serve(configuration, handlers: handlers, context: context)
        }
    }

    /// Runs the worker until SIGTERM/SIGINT and turns the outcome into an exit status.
    static func serve(_ configuration: WorkerConfiguration, handlers: UpstreamHandlers, context: WorkerCommandContext) async -> Int32 {
        let worker = FCMWorker(configuration: configuration, handlers: handlers)
        for warning in configuration.warnings { worker.logger.warning(warning) }
        worker.logger.info("handlers: \(handlers.names.joined(separator: ", "))")
        let task = Task { try await worker.run() }
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
        switch await task.result {
        case .success:
            return 0
        case .failure(let error as XMPPError) where error.isConfigurationError:
            return context.fail("\(error)", status: 3)
        case .failure(let error as ConfigurationError):
            return context.fail(error.description)
        case .failure(let error as Migrator.MigrationError):
            return context.fail(error.description)
        case .failure(let error as PostgresError) where error.kind == .configuration:
            return context.fail(error.description)
        case .failure(let error):
            return context.fail("\(error)", status: 1)
        }
    }

    /// `migrate`: apply the pending migrations.
    static let migrateCommand: WorkerCommand = {
        let options = OptionTable<WorkerConfiguration>(WorkerConfiguration.options.options.filter { ["--database-url", "--migrations-dir"].contains($0.flag) }) { settings throws(ConfigurationError) in
            guard settings.databaseURL != nil else {
                throw ConfigurationError("missing database URL: pass --database-url or set DATABASE_URL")
            }
        }
        return WorkerCommand(name: "migrate", summary: "apply pending database migrations, each in its own transaction",
                             options: options.help, optionsMarkdown: options.markdownTable) { arguments, context in
            var status: Int32 = 0
            guard let (configuration, positional) = context.parse(arguments, with: options, into: WorkerConfiguration(senderID: "", serverKey: ""),
                                                                  status: &status) else { return status }
            if let extra = positional.first { return context.fail("migrate: unexpected argument \(extra)") }
            do {
                let migrator = try Migrator(directory: configuration.migrationsDirectory)
                // A one-off command gains nothing from prepared statements, and then works
                // behind any pooler; a migration may take long (no call deadline).
                let connection = try await PostgresConnection.connect(configuration.databaseURL!, callTimeout: nil, preparesStatements: false)
                let applied = try await migrator.migrate(connection)
                await connection.close()
                print(applied.isEmpty ? "the database is up to date (\(migrator.migrations.count) migration(s))"
                                      : "applied: \(applied.joined(separator: ", "))")
                return 0
            } catch let error as Migrator.MigrationError {
                return context.fail("migrate: \(error.description)")
            } catch let error as PostgresError where error.kind == .configuration {
                return context.fail("migrate: \(error.description)")
            } catch {
                return context.fail("migrate: \(error)", status: 1)
            }
        }
    }()

    /// Writes `fcm-worker: LINE` to standard error.
    public static func printError(_ line: String) {
        WorkerCommandContext(program: "fcm-worker", environment: [:]).printError(line)
    }
}
