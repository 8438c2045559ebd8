import Foundation
import Handlers
import Postgres
import Worker

let usage = """
    fcm-worker: a backend worker for Firebase Cloud Messaging's XMPP connection server (CCS)

    usage:
      fcm-worker run [options]        connect to CCS, ack upstream messages, run the handlers
    \(WorkerConfiguration.usage)
      fcm-worker migrate [--database-url URL] [--migrations-dir PATH]
                                      apply pending database migrations
    \(GroupsCommand.usage)
    \(SimulateCommand.usage)
    \(BenchCommand.usage)
      fcm-worker --help               this text

    Built-in handlers: \(BuiltInHandlers.all.keys.sorted().joined(separator: ", ")).
    Flags win over environment variables. Exit status: 0 after SIGTERM/SIGINT, 2 for a
    missing or invalid setting or pending migrations, 3 when FCM refuses the credentials or
    the certificate, 1 otherwise.
    """

func migrate(_ arguments: [String]) async -> Int32 {
    var databaseURL = ProcessInfo.processInfo.environment["DATABASE_URL"]
    var directory = Migrator.defaultDirectory()
    var index = 0
    while index < arguments.count {
        guard index + 1 < arguments.count else {
            WorkerMain.printError("migrate: \(arguments[index]) needs a value")
            return 2
        }
        switch arguments[index] {
        case "--database-url": databaseURL = arguments[index + 1]
        case "--migrations-dir": directory = arguments[index + 1]
        default:
            WorkerMain.printError("migrate: unknown option \(arguments[index])")
            return 2
        }
        index += 2
    }
    guard let databaseURL, !databaseURL.isEmpty else {
        WorkerMain.printError("missing database URL: pass --database-url or set DATABASE_URL")
        return 2
    }
    do {
        let migrator = try Migrator(directory: directory)
        // A one-off command gains nothing from prepared statements, and then works behind any pooler.
        let connection = try await PostgresConnection.connect(databaseURL, preparesStatements: false)
        let applied = try await migrator.migrate(connection)
        await connection.close()
        print(applied.isEmpty ? "the database is up to date (\(migrator.migrations.count) migration(s))"
                              : "applied: \(applied.joined(separator: ", "))")
        return 0
    } catch let error as Migrator.MigrationError {
        WorkerMain.printError(error.description)
        return 2
    } catch {
        WorkerMain.printError("\(error)")
        return 1
    }
}

var arguments = Array(CommandLine.arguments.dropFirst())
let command = arguments.isEmpty ? "--help" : arguments.removeFirst()
let status: Int32
switch command {
case "run":
    status = await WorkerMain.run(arguments: arguments, environment: ProcessInfo.processInfo.environment) { configuration throws(ConfigurationError) in
        try BuiltInHandlers.resolve(configuration.handlers)
    }
case "migrate": status = await migrate(arguments)
case "simulate": status = await SimulateCommand.run(arguments)
case "groups": status = await GroupsCommand.run(arguments, environment: ProcessInfo.processInfo.environment)
case "bench": status = await BenchCommand.run(arguments)
case "--help", "-h", "help":
    print(usage)
    status = 0
default:
    WorkerMain.printError("unknown command \(command) (see fcm-worker --help)")
    status = 2
}
exit(status)
