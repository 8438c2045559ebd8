import FCM
import Foundation
import Simulator
import Testing

/// Journal mode under full load: a test that saturates the cores for half a minute, so
/// `scripts/test` runs it on its own after the rest (with the timing tests it would skew
/// their figures, with the busy pass it starves the in-process workers of other tests).
@Suite struct JournalLoadTests {
    @Test func killDashNineInJournalModeUnderFullLoadLosesNothingAcked() async throws {
        let ccs = try TestCCS(configure: { $0.recordsEvents = true })
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let spool = FileManager.default.temporaryDirectory.appendingPathComponent("spool-\(UUID())").path
        let (first, _) = try WorkerProcess.start(ccs, databaseURL: database.url, spool: spool, ["--ack-mode", "journal", "--connections", "2"])
        try await ccs.simulator.waitForBoundSessions(2)
        let total = 20_000
        for index in 0..<total { ccs.simulator.injectUpstream(from: "d\(index % 200)", messageID: "f\(index)") }
        try await ccs.simulator.wait(for: "some acks", timeout: .seconds(60)) { $0.acked.count >= 4000 }
        kill(first.processIdentifier, SIGKILL)
        try await WorkerProcess.waitForExit(first)
        let ackedBeforeKill = Set(ccs.simulator.events.acked)
        let storedAtKill = try await database.storedMessageIDs()
        #expect(!ackedBeforeKill.isEmpty)

        // The next start replays the journal, then CCS redelivers what was not acked.
        let (second, errors) = try WorkerProcess.start(ccs, databaseURL: database.url, spool: spool, ["--ack-mode", "journal", "--connections", "2"])
        defer { if second.isRunning { second.terminate() } }
        try await ccs.simulator.wait(for: "every message acked", timeout: .seconds(120)) { Set($0.acked).count >= total }
        await database.waitForRows(in: "upstream_messages", count: total, within: .seconds(60))
        kill(second.processIdentifier, SIGTERM)
        try await WorkerProcess.waitForExit(second)
        let log = String(decoding: await readToEnd(errors.fileHandleForReading), as: UTF8.self)
        #expect(second.terminationStatus == 0, "\(log.suffix(2000))")
        let stored = try await database.storedMessageIDs()
        let lost = ackedBeforeKill.subtracting(stored)
        #expect(lost.isEmpty, "\(lost.count) message(s) acked before the kill are missing, e.g. \(lost.prefix(5))")
        #expect(stored.count == total)
        // What the journal held at the kill is what it replayed (zero when everything acked had also committed).
        let replayed = ackedBeforeKill.subtracting(storedAtKill).count
        if replayed > 0 { #expect(log.contains("its journal"), "\(log.suffix(2000))") }
        // Committed messages leave no journal behind (see above).
        #expect(UpstreamJournalFiles.messageIDs(beside: spool, prefix: "f").isSubset(of: stored))
    }
}
