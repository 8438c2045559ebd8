import FCM
import Foundation
import Postgres

/// FCM device groups (`POST /fcm/notification`), with each group's notification key and
/// tokens kept in the `device_groups` table so that applications can address the group
/// (`INSERT INTO downstream_messages (target, …) VALUES (notification_key, …)`).
///
/// FCM is asked first; the table changes only once FCM has agreed. Removing a group's
/// last token deletes the group, at FCM and in the table.
public struct DeviceGroups: Sendable {
    /// One group as the table keeps it.
    public struct Group: Sendable, Equatable {
        public let name: String
        public let notificationKey: String
        public let tokens: [String]

        public init(name: String, notificationKey: String, tokens: [String]) {
            self.name = name
            self.notificationKey = notificationKey
            self.tokens = tokens
        }
    }

    /// A name with no group, or an operation FCM refused.
    public struct GroupError: Error, Equatable, CustomStringConvertible {
        public let description: String
    }

    private let client: FCMHTTPClient
    private let database: PostgresConnection

    public init(client: FCMHTTPClient, database: PostgresConnection) {
        self.client = client
        self.database = database
    }

    /// Creates group `name` with `tokens`; returns it.
    public func create(_ name: String, tokens: [String]) async throws -> Group {
        let key = try await client.deviceGroup(.create(name: name, tokens: tokens))
        try await database.execute("INSERT INTO device_groups (name, notification_key, tokens) VALUES ($1, $2, $3::text[])",
                                   [.text(name), .text(key), .array(tokens.map { .text($0) })])
        return Group(name: name, notificationKey: key, tokens: tokens)
    }

    /// Adds `tokens` to group `name`.
    public func add(_ name: String, tokens: [String]) async throws -> Group {
        let group = try await find(name)
        _ = try await client.deviceGroup(.add(name: name, key: group.notificationKey, tokens: tokens))
        let merged = group.tokens + tokens.filter { !group.tokens.contains($0) }
        try await database.execute("UPDATE device_groups SET tokens = $2::text[], updated_at = now() WHERE name = $1",
                                   [.text(name), .array(merged.map { .text($0) })])
        return Group(name: name, notificationKey: group.notificationKey, tokens: merged)
    }

    /// Removes `tokens` from group `name`; nil once the group has no token left (deleted).
    public func remove(_ name: String, tokens: [String]) async throws -> Group? {
        let group = try await find(name)
        _ = try await client.deviceGroup(.remove(name: name, key: group.notificationKey, tokens: tokens))
        let remaining = group.tokens.filter { !tokens.contains($0) }
        if remaining.isEmpty {
            try await database.execute("DELETE FROM device_groups WHERE name = $1", [.text(name)])
            return nil
        }
        try await database.execute("UPDATE device_groups SET tokens = $2::text[], updated_at = now() WHERE name = $1",
                                   [.text(name), .array(remaining.map { .text($0) })])
        return Group(name: name, notificationKey: group.notificationKey, tokens: remaining)
    }

    /// Every group, or the one named.
    public func show(_ name: String? = nil) async throws -> [Group] {
        let rows = try await database.query("""
            SELECT name, notification_key, tokens FROM device_groups
            WHERE $1::text IS NULL OR name = $1 ORDER BY name
            """, [name.map { .text($0) } ?? .null])
        return rows.map { row in
            Group(name: row.string(0) ?? "", notificationKey: row.string(1) ?? "", tokens: row.strings(2) ?? [])
        }
    }

    private func find(_ name: String) async throws -> Group {
        guard let group = try await show(name).first else {
            throw GroupError(description: "no device group named \(name) (create it with `fcm-worker groups create`)")
        }
        return group
    }
}
