import FCM
import Foundation
import Postgres
import Worker

/// `fcm-worker groups create|add|remove|show`: device groups through FCM's HTTP API, kept
/// in the `device_groups` table.
enum GroupsCommand {
    static let usage = """
      fcm-worker groups create NAME TOKEN... [options]   create a device group
      fcm-worker groups add NAME TOKEN... [options]      add tokens to it
      fcm-worker groups remove NAME TOKEN... [options]   remove tokens (the last one deletes it)
      fcm-worker groups show [NAME] [options]            list groups from the database
                                      options: those of `run` (sender ID, server key,
                                      --http-endpoint, --ca-file, --database-url)
    """

    static func run(_ arguments: [String], environment: [String: String]) async -> Int32 {
        let positional = Array(arguments.prefix { !$0.hasPrefix("--") })
        let flags = Array(arguments.dropFirst(positional.count))
        guard let operation = positional.first, ["create", "add", "remove", "show"].contains(operation) else {
            return fail("groups: expected create, add, remove or show (see fcm-worker --help)")
        }
        let name = positional.dropFirst().first
        let tokens = Array(positional.dropFirst(2))
        guard operation == "show" || (name != nil && !tokens.isEmpty) else {
            return fail("groups \(operation): expected a group name and at least one token")
        }
        let configuration: WorkerConfiguration
        do {
            configuration = try WorkerConfiguration.parse(arguments: flags, environment: environment)
        } catch {
            return fail(error.description)
        }
        guard let databaseURL = configuration.databaseURL else {
            return fail("missing database URL: pass --database-url or set DATABASE_URL")
        }
        do {
            // A one-off command gains nothing from prepared statements, and then works behind any pooler.
            let database = try await PostgresConnection.connect(databaseURL, preparesStatements: false)
            defer { Task { await database.close() } }
            let groups = DeviceGroups(client: try FCMHTTPClient(settings: configuration.httpClient), database: database)
            switch operation {
            case "create": print(describe(try await groups.create(name!, tokens: tokens)))
            case "add": print(describe(try await groups.add(name!, tokens: tokens)))
            case "remove":
                if let group = try await groups.remove(name!, tokens: tokens) { print(describe(group)) } else {
                    print("\(name!): deleted (its last token was removed)")
                }
            default:
                let list = try await groups.show(name)
                if list.isEmpty { print(name.map { "no device group named \($0)" } ?? "no device groups") }
                for group in list { print(describe(group)) }
            }
            return 0
        } catch let error as FCMHTTPClient.Failure {
            WorkerMain.printError("groups \(operation): \(error)")
            return error.isConfigurationError ? 3 : 1
        } catch {
            WorkerMain.printError("groups \(operation): \(error)")
            return 1
        }
    }

    private static func describe(_ group: DeviceGroups.Group) -> String {
        "\(group.name): notification_key \(group.notificationKey), \(group.tokens.count) token(s): \(group.tokens.joined(separator: " "))"
    }

    private static func fail(_ line: String) -> Int32 {
        WorkerMain.printError(line)
        return 2
    }
}
