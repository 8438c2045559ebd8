import FCM
import Foundation
import Simulator
import Testing
import TestSupport

/// The worker as a process under signals: nothing acked is ever lost.
@Suite struct ProcessLifecycleTests {
    /// Starts `fcm-worker run` against `ccs` and `database` with extra flags.
    private func startWorkerProcess(_ ccs: TestCCS, _ database: TestDatabase, spool: String, _ extra: [String]) throws -> (Process, Pipe) {
        try WorkerProcess.start(ccs, databaseURL: database.url, spool: spool, extra)
    }

    private func waitForExit(_ process: Process, limit: Duration = .seconds(30)) async throws {
        try await WorkerProcess.waitForExit(process, limit: limit)
    }

    @Test func killDashNineInDurableModeLosesNothingAcked() async throws {
        let ccs = try TestCCS(configure: { $0.recordsEvents = true })
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let spool = FileManager.default.temporaryDirectory.appendingPathComponent("spool-\(UUID())").path
        let (first, _) = try startWorkerProcess(ccs, database, spool: spool, ["--ack-mode", "durable"])
        try await ccs.simulator.waitForBoundSessions(1)
        for index in 0..<3000 { ccs.simulator.injectUpstream(from: "d\(index % 50)", messageID: "k\(index)") }
        try await ccs.simulator.wait(for: "some acks", timeout: .seconds(30)) { $0.acked.count >= 300 }
        kill(first.processIdentifier, SIGKILL)
        try await waitForExit(first)
        let ackedBeforeKill = Set(ccs.simulator.events.acked)
        #expect(!ackedBeforeKill.isEmpty)
        // Every message acked before the kill was already committed.
        let stored = try await database.storedMessageIDs()
        let lostInKill = ackedBeforeKill.subtracting(stored)
        #expect(lostInKill.isEmpty, "\(lostInKill.count) acked message(s) missing, e.g. \(lostInKill.prefix(5))")
        #expect(!FileManager.default.fileExists(atPath: spool))

        // CCS redelivers what was not acked; a new worker stores the rest, each once.
        let (second, _) = try startWorkerProcess(ccs, database, spool: spool, ["--ack-mode", "durable"])
        defer { if second.isRunning { second.terminate() } }
        try await ccs.simulator.wait(for: "every message acked", timeout: .seconds(60)) { Set($0.acked).count >= 3000 }
        kill(second.processIdentifier, SIGTERM)
        try await waitForExit(second)
        #expect(second.terminationStatus == 0)
        #expect(try await database.count("upstream_messages") == 3000)
        // With `store` alone its rows are the records: redeliveries of committed messages
        // may add records, but never one for a message that is not stored.
        #expect(try await database.count("processed_upstream", where: "message_id NOT IN (SELECT message_id FROM upstream_messages)") == 0)
    }

    @Test func killDashNineInJournalModeDuringADatabaseOutageLosesNothingAcked() async throws {
        let ccs = try TestCCS(configure: { $0.recordsEvents = true })
        defer { ccs.simulator.stop() }
        let (database, name) = try await TestDatabase.makeDedicated()
        let spool = FileManager.default.temporaryDirectory.appendingPathComponent("spool-\(UUID())").path
        let (first, _) = try startWorkerProcess(ccs, database, spool: spool, ["--ack-mode", "journal"])
        try await ccs.simulator.waitForBoundSessions(1)
        try await TestDatabase.cutOff(name)
        for index in 0..<2000 { ccs.simulator.injectUpstream(from: "d\(index % 50)", messageID: "o\(index)") }
        // Acked while nothing can commit: only the journal holds them.
        try await ccs.simulator.wait(for: "2000 acks", timeout: .seconds(30)) { Set($0.acked).count >= 2000 }
        kill(first.processIdentifier, SIGKILL)
        try await waitForExit(first)
        #expect(UpstreamJournalFiles.count(beside: spool) > 0)
        try await TestDatabase.restore(name)
        #expect(try await database.count("upstream_messages") == 0)

        let (second, errors) = try startWorkerProcess(ccs, database, spool: spool, ["--ack-mode", "journal"])
        defer { if second.isRunning { second.terminate() } }
        await database.waitForRows(in: "upstream_messages", count: 2000, within: .seconds(60))
        // The rows are visible before the replay has heard its last COMMIT answered and
        // removed what it replayed; a stop in between keeps the files for the next start
        // (whose replay finds the messages stored). So the stop waits for the removal; if it
        // never comes, the check below fails with the log.
        try? await waitUntil("the replayed journal removed", within: .seconds(30)) { UpstreamJournalFiles.names(beside: spool).isEmpty }
        kill(second.processIdentifier, SIGTERM)
        try await waitForExit(second)
        let log = String(decoding: await readToEnd(errors.fileHandleForReading), as: UTF8.self)
        #expect(second.terminationStatus == 0, "\(log.suffix(2000))")
        #expect(try await database.count("upstream_messages") == 2000)
        #expect(log.contains("replaying 2000 spooled or journaled message(s)"), "\(log.suffix(2000))")
        // Committed messages leave no journal behind: a message is journaled (and so acked)
        // only if it reaches the pipeline, however close to the stop it came.
        #expect(UpstreamJournalFiles.names(beside: spool).isEmpty, "\(UpstreamJournalFiles.names(beside: spool)) \(log.suffix(3000))")
    }

    /// A graceful shutdown in journal mode with time left commits everything it acked (38
    /// acked messages were left to the journal once in four runs: a message journaled as
    /// reading stopped never reached the pipeline), then exits 0 and leaves no journal.
    @Test func sigtermInJournalModeCommitsEverythingAckedWhileTheTimeoutAllows() async throws {
        let ccs = try TestCCS(configure: { $0.recordsEvents = true })
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let spool = FileManager.default.temporaryDirectory.appendingPathComponent("spool-\(UUID())").path
        let (worker, errors) = try startWorkerProcess(ccs, database, spool: spool, ["--ack-mode", "journal", "--shutdown-timeout", "10"])
        defer { if worker.isRunning { worker.terminate() } }
        try await ccs.simulator.waitForBoundSessions(1)
        // The table is locked: messages are journaled and acked, and wait to commit.
        let locker = try await database.connect()
        try await locker.execute("BEGIN")
        try await locker.execute("LOCK TABLE upstream_messages IN ACCESS EXCLUSIVE MODE")
        for index in 0..<1600 { ccs.simulator.injectUpstream(from: "d\(index % 50)", messageID: "j\(index)") }
        try await ccs.simulator.wait(for: "1000 acks", timeout: .seconds(30)) { Set($0.acked).count >= 1000 }
        kill(worker.processIdentifier, SIGTERM)
        try await Task.sleep(for: .seconds(2))
        try await locker.execute("COMMIT")
        await locker.close()
        try await waitForExit(worker)
        let log = String(decoding: await readToEnd(errors.fileHandleForReading), as: UTF8.self)
        #expect(worker.terminationStatus == 0, "\(log.suffix(2000))")
        let acked = Set(ccs.simulator.events.acked)
        let notCommitted = acked.subtracting(try await database.storedMessageIDs())
        #expect(notCommitted.isEmpty, "\(notCommitted.count) acked message(s) left uncommitted, e.g. \(notCommitted.prefix(5)): \(log.suffix(2000))")
        #expect(UpstreamJournalFiles.names(beside: spool).isEmpty)
    }

    @Test func sigtermWithWorkInFlightCommitsEverythingAckedAndExitsZero() async throws {
        let ccs = try TestCCS(configure: { $0.recordsEvents = true })
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let spool = FileManager.default.temporaryDirectory.appendingPathComponent("spool-\(UUID())").path
        let (worker, errors) = try startWorkerProcess(ccs, database, spool: spool, [])
        try await ccs.simulator.waitForBoundSessions(1)
        for index in 0..<5000 { ccs.simulator.injectUpstream(from: "d\(index % 50)", messageID: "t\(index)") }
        try await ccs.simulator.wait(for: "some acks", timeout: .seconds(30)) { $0.acked.count >= 500 }
        kill(worker.processIdentifier, SIGTERM)
        try await waitForExit(worker)
        let log = String(decoding: await readToEnd(errors.fileHandleForReading), as: UTF8.self)
        #expect(worker.terminationStatus == 0, "\(log.suffix(2000))")
        let acked = Set(ccs.simulator.events.acked)
        let stored = try await database.storedMessageIDs()
        let lost = acked.subtracting(stored)
        #expect(lost.isEmpty, "\(lost.count) acked message(s) neither stored nor spooled, e.g. \(lost.prefix(5))")
        #expect(!FileManager.default.fileExists(atPath: spool))
        #expect(log.contains("received SIGTERM"))
        #expect(log.contains("stopped"))
    }

    @Test func twoWorkerProcessesOnOneOutboxSendEachRowOnce() async throws {
        let log = DownstreamLog { _, _ in .ack(delay: .milliseconds(2)) }
        let ccs = try TestCCS(log: log)
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let spool = FileManager.default.temporaryDirectory.appendingPathComponent("spool-\(UUID())").path
        let (first, firstErrors) = try startWorkerProcess(ccs, database, spool: spool + "-1", ["--worker-id", "process-1"])
        defer { if first.isRunning { first.terminate() } }
        let (second, secondErrors) = try startWorkerProcess(ccs, database, spool: spool + "-2", ["--worker-id", "process-2"])
        defer { if second.isRunning { second.terminate() } }
        try await ccs.simulator.waitForBoundSessions(2, timeout: .seconds(20))
        // In four batches, so that both processes are listening while rows keep coming.
        for _ in 0..<4 {
            try await database.insertOutbox((0..<1000).map { ("token-\($0)", #"{"data":{"k":"v"}}"#) })
            try await Task.sleep(for: .milliseconds(300))
        }
        try await database.waitForOutbox("status = 'acked'", count: 4000, within: .seconds(60))
        kill(first.processIdentifier, SIGTERM)
        kill(second.processIdentifier, SIGTERM)
        try await waitForExit(first)
        try await waitForExit(second)
        let logs = [await readToEnd(firstErrors.fileHandleForReading), await readToEnd(secondErrors.fileHandleForReading)]
            .map { String(decoding: $0, as: UTF8.self) }
        #expect(first.terminationStatus == 0 && second.terminationStatus == 0, "\(logs.map { $0.suffix(1000) })")
        let sent = log.all.map(\.messageID)
        #expect(sent.count == 4000, "sent \(sent.count) times for 4000 rows")
        #expect(Set(sent).count == 4000)
        let claimers = try await database.query("SELECT claimed_by, count(*) FROM downstream_messages GROUP BY 1 ORDER BY 1")
            .map { "\($0.string(0) ?? "-")=\($0.string(1) ?? "0")" }
        #expect(claimers.count == 2 && claimers.allSatisfy { $0.hasPrefix("process-") }, "\(claimers)")
        #expect(ccs.simulator.violations.isEmpty)
    }

    @Test func aSecondWorkerOnTheSameSpoolIsRefusedAtStart() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let spool = FileManager.default.temporaryDirectory.appendingPathComponent("spool-\(UUID())").path
        let (first, _) = try startWorkerProcess(ccs, database, spool: spool, [])
        defer { if first.isRunning { first.terminate() } }
        try await ccs.simulator.waitForBoundSessions(1)
        let (second, errors) = try startWorkerProcess(ccs, database, spool: spool, [])
        try await waitForExit(second)
        let message = String(decoding: await readToEnd(errors.fileHandleForReading), as: UTF8.self)
        #expect(second.terminationStatus == 2)
        #expect(message.contains("is in use by another worker process"), "\(message)")
        #expect(first.isRunning)
    }

    @Test func aCorruptSpoolIsSetAsideAndDoesNotBlockStartUp() async throws {
        let ccs = try TestCCS(configure: { $0.recordsEvents = true })
        defer { ccs.simulator.stop() }
        let (database, name) = try await TestDatabase.makeDedicated()
        let spool = FileManager.default.temporaryDirectory.appendingPathComponent("spool-\(UUID())").path
        // A first run spools what it acked while the database was down.
        let (first, _) = try startWorkerProcess(ccs, database, spool: spool, ["--shutdown-timeout", "1"])
        try await ccs.simulator.waitForBoundSessions(1)
        try await TestDatabase.cutOff(name)
        for index in 0..<20 { ccs.simulator.injectUpstream(from: "d", messageID: "c\(index)") }
        try await ccs.simulator.wait(for: "20 acks", timeout: .seconds(20)) { Set($0.acked).count >= 20 }
        kill(first.processIdentifier, SIGTERM)
        try await waitForExit(first)
        #expect(first.terminationStatus == 0)
        // The disk then damages it: garbage, and a record torn in the middle of a write.
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: spool))
        try handle.seekToEnd()
        try handle.write(contentsOf: Data("not a record\n0badc0de {\"connection\":\"x\",\"pay".utf8))
        try handle.close()
        try await TestDatabase.restore(name)
        let (second, errors) = try startWorkerProcess(ccs, database, spool: spool, [])
        defer { if second.isRunning { second.terminate() } }
        await database.waitForRows(in: "upstream_messages", count: 20, within: .seconds(30))
        #expect(try await database.count("upstream_messages") == 20)
        #expect(!FileManager.default.fileExists(atPath: spool))
        let setAside = try String(contentsOfFile: spool + ".corrupt", encoding: .utf8)
        #expect(setAside.contains("not a record") && setAside.contains("0badc0de"))
        kill(second.processIdentifier, SIGTERM)
        try await waitForExit(second)
        let log = String(decoding: await readToEnd(errors.fileHandleForReading), as: UTF8.self)
        #expect(log.contains("2 torn or corrupt record(s)"), "\(log.suffix(2000))")
        #expect(second.terminationStatus == 0)
    }
}

/// The journal segments a worker left beside its spool.
enum UpstreamJournalFiles {
    static func names(beside spool: String) -> [String] {
        let folder = (spool as NSString).deletingLastPathComponent
        let prefix = (spool as NSString).lastPathComponent + ".journal-"
        return ((try? FileManager.default.contentsOfDirectory(atPath: folder)) ?? []).filter { $0.hasPrefix(prefix) }
    }

    static func count(beside spool: String) -> Int { names(beside: spool).count }

    /// The ids (`PREFIX` and digits) of the messages in the journal segments left beside `spool`.
    static func messageIDs(beside spool: String, prefix: String) -> Set<String> {
        let folder = (spool as NSString).deletingLastPathComponent
        var ids = Set<String>()
        for name in names(beside: spool) {
            let text = (try? String(contentsOfFile: folder + "/" + name, encoding: .utf8)) ?? ""
            for part in text.components(separatedBy: "message_id\\\":\\\"").dropFirst() {
                ids.insert(String(part.prefix { $0 != "\\" }))
            }
        }
        return ids.filter { $0.hasPrefix(prefix) }
    }
}
