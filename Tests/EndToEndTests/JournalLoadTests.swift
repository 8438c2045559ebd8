import FCM
import Foundation
import Runtime
import Simulator
import Testing
import Worker

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

/// The journal on a filesystem of its own that the journal itself can fill: a 2 MiB tmpfs
/// (mounted by the test, so as root only: CI runs as root). Under a steady flow whose
/// records add up to several times the disk, the journal cuts its segments early and
/// deletes the committed ones (also before a failed write is tried again), so it never
/// deadlocks on its own disk (the current segment
/// used to reach the disk's size, the write fail and be retried for ever: thousands stored,
/// then receiving stopped for good).
@Suite(.enabled(if: getuid() == 0, "mounts a tmpfs: needs root (CI runs as root)"))
struct JournalDiskTests {
    @Test func theJournalNeverFillsItsOwnDisk() async throws {
        let mount = FileManager.default.temporaryDirectory.appendingPathComponent("journal-disk-\(UUID())").path
        try FileManager.default.createDirectory(atPath: mount, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: mount) }
        /// Runs a mount command as the suite runs every child: one launch at a time, awaited
        /// without blocking a cooperative-pool thread.
        func run(_ tool: String, _ arguments: [String]) async throws -> Int32 {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: tool)
            process.arguments = arguments
            process.environment = childEnvironment()
            try launch(process)
            return await exitStatus(of: process)
        }
        try #require(try await run("/bin/mount", ["-t", "tmpfs", "-o", "size=2m", "tmpfs", mount]) == 0, "mount -t tmpfs failed")
        // Detached at the end (awaited there); on a failure, detached lazily without waiting.
        var unmounted = false
        defer {
            if !unmounted {
                let unmount = Process()
                unmount.executableURL = URL(fileURLWithPath: "/bin/umount")
                unmount.arguments = ["-l", mount]
                try? launch(unmount)
            }
        }
        let ccs = try TestCCS(configure: { $0.recordsEvents = true })
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        var configuration = try ccs.worker(database: database)
        configuration.ackMode = .journal
        configuration.spoolFile = mount + "/spool"
        let (_, task, lines) = launchLoggedWorker(configuration)
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        // About 10 MB of records: five times the disk.
        let blob = String(repeating: "j", count: 900)
        let total = 10_000
        for index in 0..<total {
            ccs.simulator.injectUpstream(from: "d\(index % 50)", data: ["blob": .string(blob)], messageID: "j\(index)")
        }
        try await ccs.simulator.wait(for: "every ack", timeout: .seconds(90)) { Set($0.acked).count >= total }
        await database.waitForRows(in: "upstream_messages", count: total, within: .seconds(60))
        // A write may still find the disk full for a moment (what is written but not yet
        // committed can pass 2 MiB under this flow): it is retried and written once the
        // committed segments are gone, never stuck.
        let said = lines.withLock { $0 }
        let failed = said.contains { $0.contains("could not write the journal") }
        #expect(!failed || said.contains { $0.contains("is written again after") }, "\(said.filter { $0.contains("journal") }.prefix(5))")
        task.cancel()
        _ = try? await task.value
        unmounted = try await run("/bin/umount", ["-l", mount]) == 0
    }
}
