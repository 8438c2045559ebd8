import FCM
import Foundation
import Postgres
import Worker

/// `fcm-worker groups create|add|remove|show`: device groups through FCM's HTTP API, kept
/// in the `device_groups` table.
enum GroupsCommand {
    /// The settings of `run` that device-group operations use.
    static let options = OptionTable<WorkerConfiguration>(WorkerConfiguration.options.options.filter {
        ["--sender-id", "--server-key", "--server-key-file", "--http-endpoint", "--ca-file", "--database-url-file", "--database-url"].contains($0.flag)
    }) { settings throws(ConfigurationError) in
        try WorkerConfiguration.options.finish(&settings)
        guard settings.databaseURL != nil else {
            throw ConfigurationError("missing database URL: pass --database-url or --database-url-file, or set DATABASE_URL")
        }
    }

    static let command = WorkerCommand(
        name: "groups", synopsis: "create|add|remove NAME TOKEN... [options], or show [NAME] [options]",
        summary: "manage device groups through FCM's HTTP API, kept in the device_groups table (removing the last token deletes a group)",
        options: options.help) { arguments, context in
            var status: Int32 = 0
            guard let (configuration, positional) = context.parse(arguments, with: options, into: WorkerConfiguration(senderID: "", serverKey: ""),
                                                                  status: &status) else { return status }
            guard let operation = positional.first, ["create", "add", "remove", "show"].contains(operation) else {
                return context.fail("groups: expected create, add, remove or show (see \(context.program) help groups)")
            }
            let name = positional.dropFirst().first
            let tokens = Array(positional.dropFirst(2))
            guard operation == "show" || (name != nil && !tokens.isEmpty) else {
                return context.fail("groups \(operation): expected a group name and at least one token")
            }
            do {
                // A one-off command gains nothing from prepared statements, and then works behind
                // any pooler. Closed before the command returns: the process exits right after.
                return try await PostgresConnection.withConnection(configuration.databaseURL!, preparesStatements: false) { database in
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
                }
            } catch let error as FCMHTTPClient.Failure {
                return context.fail("groups \(operation): \(error)", status: error.isConfigurationError ? 3 : 1)
            } catch {
                return context.fail("groups \(operation): \(error)", status: 1)
            }
        }

    private static func describe(_ group: DeviceGroups.Group) -> String {
        "\(group.name): notification_key \(group.notificationKey), \(group.tokens.count) token(s): \(group.tokens.joined(separator: " "))"
    }

}
