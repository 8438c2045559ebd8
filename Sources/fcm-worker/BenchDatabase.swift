import Benchmarks
import FCM
import Foundation
import Handlers
import Postgres
import Runtime
import Simulator
import Synchronization
import Transport
import Worker
import XMPP

/// The benchmark's own schema, and what it reads about this process.
enum BenchDatabase {
    /// Runs `body` with the URL of a fresh, migrated schema of its own, dropped afterwards
    /// (also when `body` throws).
    static func withSchema(in databaseURL: String, _ body: (String) async throws -> Void) async throws {
        let schema = "bench_\(UInt32.random(in: 0...UInt32.max))"
        let url = try await makeSchema(schema, in: databaseURL)
        do {
            try await body(url)
        } catch {
            try? await dropSchema(schema, in: databaseURL)
            throw error
        }
        try? await dropSchema(schema, in: databaseURL)
    }

    /// `url` (a `postgresql://` URL) with its database part replaced by `database`.
    static func url(_ url: String, database: String) throws -> String {
        guard let scheme = url.range(of: "://") else { throw ConfigurationError("\(url) is not a postgresql:// URL") }
        let rest = url[scheme.upperBound...]
        let query = rest.firstIndex(of: "?") ?? rest.endIndex
        let slash = rest[..<query].firstIndex(of: "/") ?? query
        return String(url[..<slash]) + "/" + database + String(rest[query...])
    }

    /// Creates `schema` in the database at `databaseURL`, migrates it, and returns a URL
    /// whose sessions use it.
    private static func makeSchema(_ schema: String, in databaseURL: String) async throws -> String {
        try await PostgresConnection.withConnection(databaseURL) { try await $0.execute("CREATE SCHEMA \(schema)") }
        let url = databaseURL + (databaseURL.contains("?") ? "&" : "?") + "options=-csearch_path%3D\(schema)"
        try await PostgresConnection.withConnection(url) { try await Migrator(sets: [.worker]).migrate($0) }
        return url
    }

    private static func dropSchema(_ schema: String, in databaseURL: String) async throws {
        try await PostgresConnection.withConnection(databaseURL) { try await $0.execute("DROP SCHEMA \(schema) CASCADE") }
    }

    /// This process's peak resident set (VmHWM), in MB.
    static func peakResidentMegabytes() -> Int {
        guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8),
              let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmHWM:") }),
              let kilobytes = line.split(separator: " ").dropFirst().first.flatMap({ Int($0) }) else { return -1 }
        return kilobytes / 1024
    }
}
