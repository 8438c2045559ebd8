import Foundation
import Testing

/// The README's two commands explain themselves: `--help` prints what they do and exits at
/// once, starting nothing (`scripts/test --help` once started PostgreSQL, PgBouncer and the
/// whole build).
@Suite struct ScriptHelpTests {
    /// The repository's root (this file is Tests/EndToEndTests/ScriptHelpTests.swift).
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    /// Runs `bash SCRIPT ARGUMENTS` (killed after 20 s); its status and standard output.
    static func bash(_ script: String, _ arguments: [String]) async throws -> (status: Int32, output: String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/bash")
        process.arguments = [Self.root.appendingPathComponent(script).path] + arguments
        process.environment = childEnvironment()
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try launch(process)
        let watchdog = Task {
            try await Task.sleep(for: .seconds(20))
            process.terminate()
        }
        let data = await readToEnd(output.fileHandleForReading)
        let status = await exitStatus(of: process)
        watchdog.cancel()
        return (status, String(decoding: data, as: UTF8.self))
    }

    @Test(arguments: ["scripts/test", "scripts/demo", "scripts/test-database"])
    func helpSaysWhatTheScriptDoesAndStartsNothing(script: String) async throws {
        for flag in ["--help", "-h"] {
            let (status, output) = try await Self.bash(script, [flag])
            #expect(status == 0, "\(script) \(flag)")
            #expect(output.contains("usage:") || output.contains("Runs"), "\(script) \(flag): \(output)")
            #expect(output.contains("PostgreSQL"), "\(script) \(flag) says what it starts: \(output)")
        }
    }
}
