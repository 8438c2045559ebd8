import Foundation
import Testing

/// The example of a team's own worker package builds against this package and runs.
@Suite struct ExamplePackageTests {
    @Test(.timeLimit(.minutes(10))) func theExamplePackageBuildsAndRunsAsAWorker() async throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let example = root.appendingPathComponent("Examples/device-registry").path
        // The build folder both example packages share (scripts/test builds them there
        // first): each compiles this package's modules again, and the second reuses the
        // first's.
        let scratch = root.appendingPathComponent(".build/examples").path
        let build = Process()
        build.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        build.arguments = ["swift", "build", "--package-path", example, "--scratch-path", scratch]
        let output = Pipe()
        build.standardOutput = output
        build.standardError = output
        try launch(build)
        let log = String(decoding: await readToEnd(output.fileHandleForReading), as: UTF8.self)
        let built = await exitStatus(of: build)
        #expect(built == 0, "\(log.suffix(3000))")
        guard built == 0 else { return }

        // Without settings its `run` behaves like `fcm-worker run`: status 2 and one clear
        // line, under its own name.
        let run = Process()
        run.executableURL = URL(fileURLWithPath: scratch + "/debug/device-registry")
        run.arguments = ["run"]
        run.environment = childEnvironment()
        let errors = Pipe()
        run.standardError = errors
        try launch(run)
        let message = String(decoding: await readToEnd(errors.fileHandleForReading), as: UTF8.self)
        #expect(await exitStatus(of: run) == 2)
        #expect(message == "device-registry: missing sender ID: pass --sender-id or set FCM_SENDER_ID\n")
    }
}
