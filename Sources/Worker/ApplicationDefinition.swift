/// What a worker executable is made of (`WorkerMain.run`'s arguments): its own settings and
/// their options, its handlers and its migrations. Every command that needs the application
/// (`run`, `migrate`, `status`, `dead-letters`, `outbox`, `prune`) builds it from here the
/// same way, so a setting given to `run` by flag or environment variable means the same to
/// each of them.
struct ApplicationDefinition<Settings: Sendable>: Sendable {
    /// The application's settings before parsing (their defaults).
    let settings: Settings
    let options: [CommandOption<Settings>]
    /// The handlers run when `--handlers` is not given (nil: every one).
    let defaultHandlers: [String]?
    let migrations: [MigrationSet]
    let makeHandlers: @Sendable (Settings) -> UpstreamHandlers

    /// The handlers' names, from the defaults (for help).
    var handlerNames: [String] { makeHandlers(settings).names }

    /// The worker's options as `run` lists them: `--handlers` names this executable's handlers.
    var workerOptions: [CommandOption<WorkerConfiguration>] {
        var options = WorkerConfiguration.options.options
        if let index = options.firstIndex(where: { $0.flag == "--handlers" }) {
            let names = handlerNames
            options[index] = CommandOption("--handlers", environment: "FCM_HANDLERS", placeholder: "a,b",
                                           default: (defaultHandlers ?? names).joined(separator: ","),
                                           help: "handlers to run, of: \(names.joined(separator: ", "))", apply: options[index].apply)
        }
        return options
    }

    /// Every setting of `run` (the worker's, then the application's), for settings `Outer`
    /// that hold them at `worker` and `application`, but for the flags in `excluding` (a
    /// command's own options that share a flag with `run`).
    func runOptions<Outer>(worker: any WritableKeyPath<Outer, WorkerConfiguration> & Sendable,
                           application: any WritableKeyPath<Outer, Settings> & Sendable,
                           excluding flags: Set<String> = []) -> [CommandOption<Outer>] {
        (workerOptions.map { $0.lifted(to: worker) } + options.map { $0.lifted(to: application) }).filter { !flags.contains($0.flag) }
    }

    /// The worker's settings before parsing, with the application's migrations.
    var initialWorker: WorkerConfiguration {
        var configuration = WorkerConfiguration(senderID: "", serverKey: "")
        configuration.migrationSets = migrations
        return configuration
    }

    /// The handlers to run with `application`'s settings: those `--handlers` names, or the
    /// defaults; `configuration.handlers` is set to their names.
    /// - Throws: `ConfigurationError` naming a handler that is not registered.
    func handlers(for configuration: inout WorkerConfiguration, application: Settings) throws(ConfigurationError) -> UpstreamHandlers {
        let available = makeHandlers(application)
        let names = configuration.handlers ?? defaultHandlers ?? available.names
        configuration.handlers = names
        return try available.selecting(names)
    }
}
