import Foundation
import Postgres
import Testing
@testable import Upstream
@testable import Worker
import Runtime
import Simulator
import Synchronization
import TestSupport

/// A primary with a synchronous hot standby (`scripts/failover-pair`: `pg_basebackup -R`),
/// made for the test and deleted after it.
private struct FailoverPair {
    static let script = DeployRecipeTests.root.appendingPathComponent("scripts/failover-pair").path
    let directory: String
    let primary: Int
    let standby: Int

    static func start() throws -> FailoverPair {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("failover-\(UUID())").path
        let output = try run("start", directory)
        let ports = output.split(separator: " ").compactMap { Int($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
        guard ports.count == 2 else { throw SimulatorError("failover-pair start printed \(output)") }
        return FailoverPair(directory: directory, primary: ports[0], standby: ports[1])
    }

    /// Both hosts, as production lists them: libpq takes the one that accepts writes.
    func url(_ database: String) -> String {
        "postgresql://postgres@127.0.0.1:\(primary),127.0.0.1:\(standby)/\(database)?target_session_attrs=read-write"
    }

    func crashPrimary() throws { _ = try Self.run("crash", directory) }
    func promoteStandby() throws { _ = try Self.run("promote", directory) }
    func stop() { _ = try? Self.run("stop", directory) }

    /// Runs the script on a thread of its own. Its output goes through files, not pipes:
    /// the servers it starts inherit its descriptors and would hold a pipe open for good.
    @discardableResult
    private static func run(_ command: String, _ directory: String) throws -> String {
        let output = FileManager.default.temporaryDirectory.appendingPathComponent("failover-output-\(UUID())").path
        let errors = output + ".errors"
        for path in [output, errors] { _ = FileManager.default.createFile(atPath: path, contents: nil) }
        defer { for path in [output, errors] { try? FileManager.default.removeItem(atPath: path) } }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/bash")
        process.arguments = [script, command, directory]
        process.standardOutput = FileHandle(forWritingAtPath: output)
        process.standardError = FileHandle(forWritingAtPath: errors)
        try launch(process)
        process.waitUntilExit()
        let text = (try? String(contentsOfFile: output, encoding: .utf8)) ?? ""
        guard process.terminationStatus == 0 else {
            throw SimulatorError("failover-pair \(command) failed: \((try? String(contentsOfFile: errors, encoding: .utf8)) ?? "")")
        }
        return text
    }
}

/// The primary crashes under load and its synchronous standby is promoted: with both hosts
/// in the URL, the worker goes on against the new primary without a restart or a CCS
/// reconnect, and everything it acked is stored there once, in immediate and durable modes.
@Suite struct FailoverTests {
    @Test(arguments: ["immediate", "durable"])
    func crashingThePrimaryUnderLoadLosesAndDoublesNothingAcked(ackMode: String) async throws {
        let pair = try await blocking { try FailoverPair.start() }
        defer { pair.stop() }
        let url = pair.url("fcm")
        try await PostgresConnection.withConnection("postgresql://postgres@127.0.0.1:\(pair.primary)/postgres") {
            try await $0.execute("CREATE DATABASE fcm")
        }
        try await PostgresConnection.withConnection(url) { try await Migrator(sets: [.worker]).migrate($0) }
        let database = TestDatabase(schema: "public", url: url)

        let ccs = try TestCCS(configure: { $0.recordsEvents = true })
        defer { ccs.simulator.stop() }
        var configuration = try ccs.worker(database: database)
        configuration.ackMode = ackMode == "durable" ? .durable : .immediate
        configuration.connections = 2
        configuration.databaseTimeout = .seconds(3)
        configuration.metricsAddress = "127.0.0.1:0"
        let (task, events) = startWorker(configuration)
        defer { task.cancel() }
        let sessions = try await ccs.simulator.waitForBoundSessions(2)
        // The load goes on, paced, from before the crash until after the promotion: the crash
        // falls under load however fast this machine stores (all at once, a fast run stored
        // everything before the crash came).
        let injecting = Atomic<Bool>(true)
        let simulator = ccs.simulator
        let injected = Atomic<Int>(0)
        let load = Task.detached {
            while injecting.load(ordering: .acquiring) {
                let first = injected.load(ordering: .relaxed)
                for index in first..<first + 50 {
                    simulator.injectUpstream(from: "d\(index % 40)", messageID: "f\(index)")
                }
                injected.store(first + 50, ordering: .releasing)
                try? await Task.sleep(for: .milliseconds(10))
            }
        }
        await database.waitForRows(in: "upstream_messages", count: 500, within: .seconds(60))
        let injectedBeforeTheCrash = injected.load(ordering: .acquiring)
        try await blocking { try pair.crashPrimary() }
        try await Task.sleep(for: .milliseconds(1_200))
        try await blocking { try pair.promoteStandby() }
        try await Task.sleep(for: .milliseconds(500))
        injecting.store(false, ordering: .releasing)
        await load.value
        let total = injected.load(ordering: .acquiring)
        #expect(injectedBeforeTheCrash < total, "the load stopped before the crash")

        try await ccs.simulator.wait(for: "\(total) acks", timeout: .seconds(90)) { Set($0.acked).count >= total }
        let acked = Set(ccs.simulator.events.acked)
        var stored: Set<String> = []
        try? await waitUntil("every acked message stored on the new primary", within: .seconds(60), every: .milliseconds(100)) {
            stored = (try? await database.storedMessageIDs()) ?? stored
            return acked.isSubset(of: stored)
        }
        let missing = acked.subtracting(stored)
        #expect(missing.isEmpty, "\(missing.count) acked message(s) not stored on the new primary, e.g. \(missing.prefix(5))")
        #expect(try await database.count("upstream_messages") == total)
        #expect(try await database.count("dead_letters") == 0)
        // The same worker and the same CCS sessions throughout.
        #expect(ccs.simulator.boundSessions == sessions)
        let server = try await PostgresConnection.withConnection(url) { try await DatabaseServer.identify(on: $0) }
        #expect(server.port == pair.standby && server.readWrite)
        // `/readyz` names the new primary once the probe reached it.
        let port = try #require(events.all.lazy.compactMap { if case .serving(let port) = $0 { port } else { nil } }.first)
        var reason = ""
        try? await waitUntil("/readyz names the new primary", within: .seconds(10), every: .milliseconds(200)) {
            reason = (try? await httpGet(port: port, path: "/readyz").body) ?? ""
            return reason.contains("127.0.0.1:\(pair.standby), read-write")
        }
        #expect(reason.contains("ready: ") && reason.contains("127.0.0.1:\(pair.standby), read-write"), "\(reason)")
        task.cancel()
        try await task.value
    }

    /// A worker whose URL leads to a standby alone waits at start, saying why, instead of
    /// exiting or failing its first commits; once the standby is promoted it runs.
    @Test func aWorkerStartedOnAStandbyWaitsForItsPromotion() async throws {
        let pair = try await blocking { try FailoverPair.start() }
        defer { pair.stop() }
        try await PostgresConnection.withConnection("postgresql://postgres@127.0.0.1:\(pair.primary)/postgres") {
            try await $0.execute("CREATE DATABASE fcm")
        }
        try await PostgresConnection.withConnection(pair.url("fcm")) { try await Migrator(sets: [.worker]).migrate($0) }
        // The standby confirms the commits it flushed, not those it replayed: wait until it
        // has replayed the database and its migrations, or the worker finds no database there.
        let written = try await PostgresConnection.withConnection("postgresql://postgres@127.0.0.1:\(pair.primary)/postgres") {
            try await $0.query("SELECT pg_current_wal_lsn()::text").first?.string(0) ?? ""
        }
        try await waitUntil("the standby replayed the migrations", within: .seconds(30), every: .milliseconds(50)) {
            let replayed = try? await PostgresConnection.withConnection("postgresql://postgres@127.0.0.1:\(pair.standby)/postgres") {
                try await $0.query("SELECT pg_last_wal_replay_lsn() >= '\(written)'::pg_lsn").first?.bool(0)
            }
            return replayed == true
        }
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let standby = TestDatabase(schema: "public", url: "postgresql://postgres@127.0.0.1:\(pair.standby)/fcm")
        var configuration = try ccs.worker(database: standby)
        configuration.metricsAddress = "127.0.0.1:0"
        let (task, events) = startWorker(configuration)
        defer { task.cancel() }
        try await events.wait(for: "the standby noticed", timeout: .seconds(20)) {
            $0.contains { if case .databaseUnavailable(let reason) = $0 { reason.contains("read-only standby at 127.0.0.1:\(pair.standby)") } else { false } }
        }
        #expect(ccs.simulator.boundSessions.isEmpty)
        try await blocking { try pair.crashPrimary() }
        try await blocking { try pair.promoteStandby() }
        try await ccs.simulator.waitForBoundSessions(1)
        ccs.simulator.injectUpstream(from: "d1", messageID: "after-promotion")
        await standby.waitForRows(in: "upstream_messages", count: 1, within: .seconds(20))
        #expect(try await standby.storedMessageIDs() == ["after-promotion"])
        task.cancel()
        try await task.value
    }
}
