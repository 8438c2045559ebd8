import Foundation
import Simulator

/// `fcm-worker run` as a process of its own, against a test simulator and database.
enum WorkerProcess {
    /// Starts it with the CA of `ccs` trusted and `extra` flags; its standard error is piped.
    /// - Parameter descriptorLimit: runs it under `prlimit --nofile=N:N` (soft and hard).
    static func start(_ ccs: TestCCS, databaseURL: String, spool: String, _ extra: [String],
                      environment: [String: String] = [:], descriptorLimit: Int? = nil) throws -> (Process, Pipe) {
        let caPath = FileManager.default.temporaryDirectory.appendingPathComponent("ca-\(UUID()).pem").path
        try ccs.authority.rootCertificatePEM.write(toFile: caPath, atomically: true, encoding: .utf8)
        let process = Process()
        let arguments = ["run", "--sender-id", TestCCS.senderID, "--server-key", TestCCS.serverKey,
                         "--endpoint", "127.0.0.1:\(ccs.simulator.port)", "--ca-file", caPath,
                         "--database-url", databaseURL,
                         "--spool-file", spool] + extra
        if let descriptorLimit {
            process.executableURL = URL(fileURLWithPath: "/usr/bin/prlimit")
            process.arguments = ["--nofile=\(descriptorLimit):\(descriptorLimit)", "--", try CommandLineTests.executable.path] + arguments
        } else {
            process.executableURL = try CommandLineTests.executable
            process.arguments = arguments
        }
        process.environment = childEnvironment().merging(environment) { $1 }
        let errors = Pipe()
        process.standardError = errors
        process.standardOutput = FileHandle.nullDevice
        try launch(process)
        return (process, errors)
    }

    /// Waits for `process` to exit; terminates it and fails after `limit`.
    static func waitForExit(_ process: Process, limit: Duration = .seconds(30)) async throws {
        let deadline = ContinuousClock.now + limit
        while process.isRunning {
            guard ContinuousClock.now < deadline else {
                process.terminate()
                throw SimulatorError("the worker did not exit within \(limit)")
            }
            try await Task.sleep(for: .milliseconds(20))
        }
    }

    /// Sends SIGTERM and waits for the exit; returns how long it took (SIGKILL and a
    /// failure after `limit`).
    static func terminate(_ process: Process, limit: Duration) async throws -> Duration {
        let started = ContinuousClock.now
        kill(process.processIdentifier, SIGTERM)
        while process.isRunning {
            guard ContinuousClock.now - started < limit else {
                kill(process.processIdentifier, SIGKILL)
                throw SimulatorError("the worker did not exit within \(limit) of SIGTERM")
            }
            try await Task.sleep(for: .milliseconds(20))
        }
        return ContinuousClock.now - started
    }
}
