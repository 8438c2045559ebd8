import Runtime
import Foundation
import Synchronization

/// Every line the workers of the test suite log (and the output of the processes it
/// runs), appended to `$FCM_TEST_LOG_DIR/lines.log` when `scripts/test` sets that folder,
/// for `LogSweepTests` to read in the pass after.
enum TestLog {
    private static let file: BlockingLock<FileHandle?> = BlockingLock({
        guard let folder = ProcessInfo.processInfo.environment["FCM_TEST_LOG_DIR"], !folder.isEmpty else { return nil }
        let path = folder + "/lines.log"
        if !FileManager.default.fileExists(atPath: path) { _ = FileManager.default.createFile(atPath: path, contents: nil) }
        guard let handle = FileHandle(forWritingAtPath: path) else { return nil }
        handle.seekToEndOfFile()
        return handle
    }())

    /// Keeps `text` (one or more lines) for the sweep.
    static func record(_ text: String) {
        file.withLock { handle in
            guard let handle else { return }
            handle.write(Data((text.hasSuffix("\n") ? text : text + "\n").utf8))
        }
    }
}

/// The secrets the test suite uses, which no log line may show: the server key CCS
/// accepts and the password in the test database's URLs (the test cluster trusts every
/// login, so the password is never checked, only carried everywhere the URL goes).
enum TestSecrets {
    static let databasePassword = "test-db-pa55word"
    /// The server key, the database password, any PEM private key (a service account's),
    /// and the simulator's OAuth2 access tokens.
    static var all: [String] { [TestCCS.serverKey, databasePassword, "PRIVATE KEY", "ya29.sim-"] }
}
