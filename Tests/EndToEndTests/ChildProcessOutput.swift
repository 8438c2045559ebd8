import Foundation

/// Reads `handle` to its end on a thread of its own: a child process can run for many
/// seconds, and blocking a cooperative-pool thread that long stalls every other test.
func readToEnd(_ handle: FileHandle) async -> Data {
    await withCheckedContinuation { continuation in
        let reader = Thread {
            let data = handle.readDataToEndOfFile()
            TestLog.record(String(decoding: data, as: UTF8.self))
            continuation.resume(returning: data)
        }
        reader.name = "test pipe reader"
        reader.start()
    }
}

/// Waits for `process` to exit without blocking a cooperative-pool thread.
func exitStatus(of process: Process) async -> Int32 {
    while process.isRunning { try? await Task.sleep(for: .milliseconds(20)) }
    return process.terminationStatus
}

/// Starts `process`, one launch at a time across the test process: Foundation's
/// `Process.run()` crashed (a bad memcpy inside it) when tests launched children from
/// several threads at once.
func launch(_ process: Process) throws {
    try launchLock.withLock { try process.run() }
}

private let launchLock = NSLock()

/// The environment a test gives the processes it starts: a fixed PATH, and the sanitizer
/// settings of the run (`scripts/test --sanitize` sets them for the whole suite), nothing else.
func childEnvironment() -> [String: String] {
    var environment = ["PATH": "/usr/bin:/bin"]
    for name in ["ASAN_OPTIONS", "TSAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS"] {
        if let value = ProcessInfo.processInfo.environment[name] { environment[name] = value }
    }
    return environment
}
