import Foundation
import Testing

/// Runs in the pass after the suite (`scripts/test`): every line the suite logged, from
/// workers in the test process and from the processes it ran, is searched for the server
/// key, the database password, a private key and an access token.
@Suite(.enabled(if: ProcessInfo.processInfo.environment["FCM_TEST_LOG_DIR"].map { !$0.isEmpty } ?? false))
struct LogSweepTests {
    @Test func noLineTheSuiteLoggedShowsTheServerKeyOrTheDatabasePassword() throws {
        let folder = ProcessInfo.processInfo.environment["FCM_TEST_LOG_DIR"]!
        let text = try String(contentsOfFile: folder + "/lines.log", encoding: .utf8)
        let lines = text.split(separator: "\n")
        // The sweep must have something to sweep: the suite's workers log as they go.
        #expect(lines.count > 500, "only \(lines.count) lines were logged")
        #expect(lines.contains { $0.contains("database") && $0.contains("starting") })
        for secret in TestSecrets.all {
            let showing = lines.filter { $0.contains(secret) }
            #expect(showing.isEmpty, "\(showing.count) line(s) show \(secret): \(showing.prefix(3))")
        }
    }
}
