import Foundation
import Simulator
import Testing
import TestSupport

/// The `fcm-worker` executable as an operator runs it.
@Suite struct CommandLineTests {
    struct Outcome {
        var status: Int32
        var standardError: String
    }

    /// The built `fcm-worker`, next to the test bundle.
    static var executable: URL {
        get throws {
            let url = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("fcm-worker")
            guard FileManager.default.isExecutableFile(atPath: url.path) else {
                throw SimulatorError("\(url.path) is missing: build the package (swift build) before the tests")
            }
            return url
        }
    }

    /// Runs `fcm-worker` with `arguments` and a clean environment plus `environment`; when
    /// `ready` is given, runs it and then sends SIGTERM; kills the process after 20 s in
    /// any case.
    static func run(_ arguments: [String], environment: [String: String] = [:],
                    whenReady ready: (@Sendable () async throws -> Void)? = nil) async throws -> Outcome {
        let process = Process()
        process.executableURL = try executable
        process.arguments = arguments
        process.environment = childEnvironment().merging(environment) { $1 }
        let errorPipe = Pipe()
        process.standardError = errorPipe
        process.standardOutput = FileHandle.nullDevice
        try launch(process)
        let watchdog = Task {
            try await Task.sleep(for: .seconds(20))
            process.terminate()
        }
        if let ready {
            try await ready()
            kill(process.processIdentifier, SIGTERM)
        }
        let errorData = await readToEnd(errorPipe.fileHandleForReading)
        let status = await exitStatus(of: process)
        watchdog.cancel()
        return Outcome(status: status, standardError: String(decoding: errorData, as: UTF8.self))
    }

    @Test func aMissingSettingExitsWithStatus2AndOneLine() async throws {
        let outcome = try await Self.run(["run"], environment: ["FCM_SERVER_KEY": "k"])
        #expect(outcome.status == 2)
        #expect(outcome.standardError == "fcm-worker: missing sender ID: pass --sender-id or set FCM_SENDER_ID\n")
    }

    @Test func refusedCredentialsExitWithinSecondsWithStatus3() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let configuration = try ccs.worker(database: await TestDatabase.make())
        let started = ContinuousClock.now
        let outcome = try await Self.run([
            "run", "--sender-id", TestCCS.senderID, "--server-key", "wrong-key-value",
            "--endpoint", "127.0.0.1:\(ccs.simulator.port)", "--ca-file", configuration.caFile!,
            "--database-url", configuration.databaseURL!,
        ])
        #expect(ContinuousClock.now - started < .seconds(10))
        #expect(outcome.status == 3)
        let lastLine = outcome.standardError.split(separator: "\n").last.map(String.init) ?? ""
        #expect(lastLine.hasPrefix("fcm-worker: authentication refused"), "\(outcome.standardError)")
        #expect(lastLine.contains("sender ID or server key"))
        #expect(!outcome.standardError.contains("wrong-key-value"))
    }

    @Test func runConnectsStaysUpThroughADropAndStopsCleanlyOnSIGTERM() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let configuration = try ccs.worker(database: database)
        let simulator = ccs.simulator
        let outcome = try await Self.run(["run"], environment: [
            "FCM_SENDER_ID": TestCCS.senderID, "FCM_SERVER_KEY": TestCCS.serverKey,
            "FCM_ENDPOINT": "127.0.0.1:\(simulator.port)", "FCM_CA_FILE": configuration.caFile!,
            "DATABASE_URL": database.url,
            "FCM_SPOOL_FILE": configuration.spoolFile,
        ]) {
            let first = try await simulator.waitForBoundSessions(1)[0]
            simulator.injectUpstream(messageID: "cli-1")
            try await simulator.wait(for: "the ack") { $0.acked.contains("cli-1") }
            simulator.drop(session: first)
            try await simulator.wait(for: "the reconnect", timeout: .seconds(5)) { $0.openBoundSessions.contains { $0 != first } }
            simulator.injectUpstream(messageID: "cli-2")
            try await simulator.wait(for: "the second ack") { $0.acked.contains("cli-2") }
        }
        #expect(outcome.status == 0, "\(outcome.standardError)")
        #expect(outcome.standardError.contains("received SIGTERM"))
        #expect(simulator.violations.isEmpty)
        #expect(try await database.count("upstream_messages", where: "message_id IN ('cli-1', 'cli-2')") == 2)
    }

    @Test func everyCommandExplainsItselfAndREADMEShowsTheRunOptions() async throws {
        for command in ["run", "migrate", "groups", "send", "simulate", "bench"] {
            let outcome = try await Self.runCapturingOutput([command, "--help"])
            #expect(outcome.status == 0, "\(command) --help")
            #expect(outcome.standardOutput.hasPrefix("usage: fcm-worker \(command)"), "\(outcome.standardOutput)")
        }
        let version = try await Self.runCapturingOutput(["--version"])
        #expect(version.status == 0 && version.standardOutput.hasPrefix("fcm-worker "))
        let help = try await Self.runCapturingOutput(["help", "migrate"])
        #expect(help.standardOutput.contains("--database-url URL") && help.standardOutput.contains("[DATABASE_URL]"))
        // README's table of settings is the one `run` parses with.
        let table = try await Self.runCapturingOutput(["help", "run", "--markdown"])
        let readme = try String(contentsOfFile: URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("README.md").path, encoding: .utf8)
        #expect(readme.contains(table.standardOutput.trimmingCharacters(in: .newlines)),
                "README's table differs from `fcm-worker help run --markdown`: paste that in")
    }

    @Test func theEqualsFormWorksForEveryCommand() async throws {
        let outcome = try await Self.run(["migrate", "--database-url=postgresql://u:s3cret@h:notaport/db"])
        #expect(outcome.status == 2)
        #expect(outcome.standardError == "fcm-worker: migrate: the database URL's port is not a number from 1 to 65535\n")
    }

    @Test func theSimulatorRefusesAnUpstreamFileItCannotUseNamingTheLine() async throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("upstream-\(UUID()).jsonl").path
        try "{\"data\": {\"a\": \"b\"}}\n{\"data\": \"text\"}\n".write(toFile: file, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: file) }
        let bad = try await Self.run(["simulate", "--upstream-file", file])
        #expect(bad.status == 2)
        #expect(bad.standardError == "fcm-worker: simulate: upstream line 2: data must be a JSON object\n")
        let missing = try await Self.run(["simulate", "--upstream-file", file + ".missing"])
        #expect(missing.status == 2)
        #expect(missing.standardError.contains("cannot read the upstream file"))
        #expect(try await Self.runCapturingOutput(["simulate", "--help"]).status == 0)
    }

    /// `simulator.env` holds the server key: readable by its owner only (it was 0644).
    @Test func theSimulatorsSettingsFileIsReadableByItsOwnerOnly() async throws {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("sim-\(UUID())").path
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let path = folder + "/simulator.env"
        let outcome = try await Self.run(["simulate", "--out", folder, "--quiet"]) {
            try await waitUntil("simulator.env is written") {
                ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").contains("FCM_HTTP_ENDPOINT")
            }
        }
        #expect(outcome.status == 0, "\(outcome.standardError)")
        let attributes = try FileManager.default.attributesOfItem(atPath: path)
        #expect((attributes[.posixPermissions] as? Int) == 0o600)
        #expect(try String(contentsOfFile: path, encoding: .utf8).contains("FCM_SERVER_KEY="))
    }

    /// A second simulator with the same `--out` that cannot listen (its port taken by the
    /// first) fails and leaves the first one's files as they were (it once wrote its own CA
    /// over the running simulator's, so that a worker could no longer verify it).
    @Test func aSimulatorThatCannotListenLeavesARunningOnesFilesAlone() async throws {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("sim-\(UUID())").path
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let env = folder + "/simulator.env", ca = folder + "/ca.pem"
        let outcome = try await Self.run(["simulate", "--out", folder, "--quiet"]) {
            try await waitUntil("simulator.env is written") {
                ((try? String(contentsOfFile: env, encoding: .utf8)) ?? "").contains("FCM_HTTP_ENDPOINT")
            }
            let settings = try String(contentsOfFile: env, encoding: .utf8)
            let endpoint = try #require(settings.split(separator: "\n").first { $0.hasPrefix("FCM_ENDPOINT=") })
            let port = String(endpoint.split(separator: ":").last ?? "")
            let before = try String(contentsOfFile: ca, encoding: .utf8)
            let second = try await Self.run(["simulate", "--out", folder, "--quiet", "--port", port])
            #expect(second.status != 0, "\(second.standardError)")
            #expect(try String(contentsOfFile: ca, encoding: .utf8) == before, "the running simulator's CA file was replaced")
            #expect(try String(contentsOfFile: env, encoding: .utf8) == settings)
        }
        #expect(outcome.status == 0, "\(outcome.standardError)")
    }

    /// Runs `fcm-worker` and returns its status and standard output.
    static func runCapturingOutput(_ arguments: [String]) async throws -> (status: Int32, standardOutput: String) {
        let process = Process()
        process.executableURL = try executable
        process.arguments = arguments
        process.environment = childEnvironment()
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try launch(process)
        let data = await readToEnd(output.fileHandleForReading)
        return (await exitStatus(of: process), String(decoding: data, as: UTF8.self))
    }
}
