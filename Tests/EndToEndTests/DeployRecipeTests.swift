import Foundation
import Testing

/// The deploy recipes under `deploy/` agree with the worker.
@Suite struct DeployRecipeTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    static let systemdAnalyze = ["/usr/bin/systemd-analyze", "/bin/systemd-analyze"].first { FileManager.default.isExecutableFile(atPath: $0) }

    @Test(.enabled(if: systemdAnalyze != nil, "systemd-analyze is not installed"))
    func theUnitFilePassesSystemdAnalyzeVerify() async throws {
        var unit = try String(contentsOf: Self.root.appendingPathComponent("deploy/fcm-worker.service"), encoding: .utf8)
        // The binary the unit names is not installed here: verify with the built one, and
        // without the environment file the operator writes.
        unit = unit.replacingOccurrences(of: "/usr/local/bin/fcm-worker", with: try CommandLineTests.executable.path)
            .replacingOccurrences(of: "EnvironmentFile=/etc", with: "EnvironmentFile=-/etc")
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("unit-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("fcm-worker.service").path
        try unit.write(toFile: path, atomically: true, encoding: .utf8)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: Self.systemdAnalyze!)
        process.arguments = ["verify", path]
        let errors = Pipe()
        process.standardError = errors
        process.standardOutput = errors
        try launch(process)
        let output = String(decoding: await readToEnd(errors.fileHandleForReading), as: UTF8.self)
        #expect(await exitStatus(of: process) == 0, "\(output)")
        #expect(!output.contains("fcm-worker.service:"), "\(output)")
    }

    @Test func theRecipesUseTheWorkersSettingsAndExitStatuses() throws {
        let unit = try String(contentsOf: Self.root.appendingPathComponent("deploy/fcm-worker.service"), encoding: .utf8)
        #expect(unit.contains("RestartPreventExitStatus=2 3"))
        #expect(unit.contains("Type=notify"))
        #expect(unit.contains("AmbientCapabilities=CAP_SYS_NICE"))
        let container = try String(contentsOf: Self.root.appendingPathComponent("deploy/Containerfile"), encoding: .utf8)
        // Every FCM_ variable the recipes set is one the worker reads.
        let help = WorkerConfigurationHelp.runOptions
        for recipe in [unit, container] {
            for match in recipe.matches(of: /FCM_[A-Z_]+/) where !help.contains(String(match.output)) {
                Issue.record("\(match.output) is not a setting of fcm-worker run")
            }
        }
        #expect(container.contains("/healthz"))
        #expect(container.contains("USER fcm-worker"))
    }
}

import Worker

/// `run`'s option table, as help prints it.
enum WorkerConfigurationHelp {
    static var runOptions: String { WorkerConfiguration.options.help }
}
