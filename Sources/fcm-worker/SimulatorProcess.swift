import Foundation
import Runtime
import Simulator
import Synchronization

/// `fcm-worker simulate` as a child process, with the settings it wrote for workers.
final class SimulatorProcess: Sendable {
    let directory: String
    let environment: [String: String]
    private let process: Process
    private let captured = BlockingLock<String?>(nil)

    private init(directory: String, environment: [String: String], process: Process) {
        self.directory = directory
        self.environment = environment
        self.process = process
    }

    /// Its standard output, once it has closed it (with `capturesOutput`).
    var output: String? { captured.withLock { $0 } }
    var isRunning: Bool { process.isRunning }
    var processIdentifier: Int32 { process.processIdentifier }

    /// Starts `fcm-worker simulate ARGUMENTS` and waits for its settings file.
    static func start(arguments: [String], capturesOutput: Bool = false) async throws -> SimulatorProcess {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("bench-sim-\(UUID())").path
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        process.arguments = ["simulate", "--out", directory, "--sender-id", "123456789012", "--server-key", "bench-key",
                             "--niceness", "-10"] + arguments
        let pipe = Pipe()
        process.standardOutput = capturesOutput ? pipe : FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        let envPath = directory + "/simulator.env"
        let deadline = ContinuousClock.now + .seconds(20)
        while !FileManager.default.fileExists(atPath: envPath) {
            guard ContinuousClock.now < deadline, process.isRunning else { throw SimulatorError("the simulator did not start") }
            try await Task.sleep(for: .milliseconds(10))
        }
        var environment: [String: String] = [:]
        for line in try String(contentsOfFile: envPath, encoding: .utf8).split(separator: "\n") {
            let parts = line.split(separator: "=", maxSplits: 1).map(String.init)
            if parts.count == 2 { environment[parts[0]] = parts[1] }
        }
        let simulator = SimulatorProcess(directory: directory, environment: environment, process: process)
        if capturesOutput {
            Thread.start(named: "simulator output") {
                let text = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
                simulator.captured.withLock { $0 = text }
            }
        }
        return simulator
    }

    /// Ends the simulator (SIGTERM) and removes the directory it wrote its settings,
    /// certificates and tokens into (a bench's worker may have kept its spool there: by
    /// now it has stopped, or is stopping on an error path). Calling it again does nothing more.
    func stop() {
        if process.isRunning { process.terminate() }
        try? FileManager.default.removeItem(atPath: directory)
    }
}
