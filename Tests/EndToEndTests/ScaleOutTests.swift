import FCM
import Foundation
import Simulator
import Testing

/// Several worker processes on one database and one CCS, as docs/operations.md describes.
@Suite struct ScaleOutTests {
    @Test(.timeLimit(.minutes(3))) func twoWorkerProcessesUnderUpstreamAndDownstreamLoadHandleAndSendEachOnce() async throws {
        let log = DownstreamLog { _, _ in .ack(delay: .milliseconds(1)) }
        let ccs = try TestCCS(log: log, configure: { $0.recordsEvents = true })
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let spool = FileManager.default.temporaryDirectory.appendingPathComponent("spool-\(UUID())").path
        // Each process: two CCS connections; `store` keeps every message, `echo` answers it
        // through the outbox (a downstream row per upstream message, in its transaction).
        var processes: [(Process, Pipe)] = []
        for index in 1...2 {
            processes.append(try WorkerProcess.start(ccs, databaseURL: database.url, spool: "\(spool)-\(index)",
                                                     ["--worker-id", "worker-\(index)", "--connections", "2", "--handlers", "store,echo"]))
        }
        defer { for (process, _) in processes where process.isRunning { process.terminate() } }
        let sessions = try await ccs.simulator.waitForBoundSessions(4, timeout: .seconds(20))

        let upstreamCount = 2000, outboxCount = 2000
        for index in 0..<upstreamCount {
            ccs.simulator.injectUpstream(from: "device-\(index % 97)", data: ["n": .string("\(index)")], messageID: "u\(index)")
            if index == upstreamCount / 2 {
                // A connection lost mid-way: CCS redelivers what it had not seen acked there.
                ccs.simulator.drop(session: sessions[0])
            }
        }
        try await database.insertOutbox((0..<outboxCount).map { ("token-\($0)", #"{"data":{"k":"v"}}"#) })

        let total = upstreamCount + outboxCount
        try await database.waitForOutbox("status = 'acked'", count: total, within: .seconds(90))
        try await ccs.simulator.wait(for: "every upstream message acked", timeout: .seconds(30)) { Set($0.acked).count >= upstreamCount }
        for (process, _) in processes { kill(process.processIdentifier, SIGTERM) }
        for (process, _) in processes { try await WorkerProcess.waitForExit(process) }
        for (process, errors) in processes {
            let text = String(decoding: await readToEnd(errors.fileHandleForReading), as: UTF8.self)
            #expect(process.terminationStatus == 0, "\(text.suffix(1500))")
        }

        // Every upstream message handled once, by one of the two: stored once, answered once.
        #expect(try await database.count("upstream_messages") == upstreamCount)
        #expect(try await database.count("downstream_messages", where: "source_message_id IS NOT NULL") == upstreamCount)
        #expect(try await database.query("SELECT count(DISTINCT source_message_id) FROM downstream_messages").first?.int(0) == Int64(upstreamCount))
        // Every outbox row sent and acked; a row may go out twice only after a lost
        // connection (at-least-once), and those resends are counted here.
        let sent = log.all.map(\.messageID)
        #expect(Set(sent).count == total)
        let resends = sent.count - Set(sent).count
        #expect(resends <= 200, "\(resends) resends")
        let claimers = try await database.query("SELECT claimed_by, count(*) FROM downstream_messages GROUP BY 1 ORDER BY 1")
            .map { $0.string(0) ?? "-" }
        #expect(claimers == ["worker-1", "worker-2"], "both processes send: \(claimers)")
        #expect(ccs.simulator.violations.isEmpty, "\(ccs.simulator.violations.prefix(3))")
        print("scale-out: \(upstreamCount) upstream handled once, \(total) rows sent, \(resends) resend(s) after the lost connection")
    }
}
