import Foundation
import Synchronization
import Postgres
import XMPP
import Runtime

/// The entry point of a worker executable: parse the settings, run until SIGTERM/SIGINT,
/// and turn the outcome into an exit status. A team's own executable is:
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
public enum WorkerMain {
    /// SIGTERM or SIGINT starts the graceful shutdown; a second one makes it urgent.
    /// Exit statuses: 0 after a signal, 2 for invalid settings or pending migrations,
    /// 3 when FCM refuses the credentials or certificate, 1 otherwise.
    public static func run(handlers: UpstreamHandlers, arguments: [String] = Array(CommandLine.arguments.dropFirst()),
                           environment: [String: String] = ProcessInfo.processInfo.environment) async -> Int32 {
        await run(arguments: arguments, environment: environment) { _ in handlers }
    }

    /// As `run(handlers:)`, choosing the handlers from the parsed settings.
    public static func run(arguments: [String], environment: [String: String],
                           handlers makeHandlers: (WorkerConfiguration) throws(ConfigurationError) -> UpstreamHandlers) async -> Int32 {
        let configuration: WorkerConfiguration
        let handlers: UpstreamHandlers
        do {
            configuration = try WorkerConfiguration.parse(arguments: arguments, environment: environment)
            handlers = try makeHandlers(configuration)
        } catch {
            printError(error.description)
            return 2
        }
        let worker = FCMWorker(configuration: configuration, handlers: handlers)
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
            printError("\(error)")
            return 3
        case .failure(let error as ConfigurationError):
            printError(error.description)
            return 2
        case .failure(let error as Migrator.MigrationError):
            printError(error.description)
            return 2
        case .failure(let error):
            printError("\(error)")
            return 1
        }
    }

    /// Writes `fcm-worker: LINE` to standard error.
    public static func printError(_ line: String) {
        FileHandle.standardError.write(Data("fcm-worker: \(line)\n".utf8))
    }
}
