@testable import FCM
import Foundation
import Runtime
import Testing
@testable import Upstream
@testable import Worker
import TestSupport

/// The journal of journal ack mode on a real disk: what is appended is on disk in order,
/// segments go once everything in them committed, and a cancelled journal writes what it holds.
@Suite struct UpstreamJournalTests {
    private func temporarySpoolPath() throws -> String {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("journal-\(UUID())")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        return folder.appendingPathComponent("spool").path
    }

    private func journal(_ spoolPath: String, segmentBytes: Int = 1 << 20, metrics: WorkerMetrics = WorkerMetrics()) -> UpstreamJournal {
        UpstreamJournal(spoolPath: spoolPath, segmentBytes: segmentBytes, logger: Logger(label: "test", minimumLevel: .critical),
                        observer: nil, metrics: metrics)
    }

    /// Records whose acks have no connection to go to (their sending fails and is logged:
    /// what is checked here is the disk).
    private func records(_ ids: Range<Int>) -> [UpstreamJournal.Record] {
        let route = CCSAckRoute(label: "ccs#test")
        return ids.map { index in
            UpstreamJournal.Record(entry: Spool.Entry(connection: "ccs#test", payload: #"{"message_id":"j\#(index)","from":"d"}"#,
                                                      receivedAt: 1_764_500_000),
                                   ack: DurableAck(messageID: "j\(index)", stanza: "", route: route))
        }
    }

    private func ids(in path: String) throws -> [String] {
        try Spool(path: path).load().entries.map { String($0.payload.dropFirst(15).prefix(while: { $0 != "\"" })) }
    }


    @Test func appendedRecordsReachTheDiskInOrderAndGoOnceCommitted() async throws {
        let spool = try temporarySpoolPath()
        let metrics = WorkerMetrics()
        let journal = journal(spool, metrics: metrics)
        let running = Task { await journal.run(until: ShutdownSignal()) }
        let first = journal.append(records(0..<3))
        let second = journal.append(records(3..<5))
        #expect(first == second)
        let path = journal.path(of: first)
        try await waitUntil("five records on disk") { (try? ids(in: path).count) == 5 }
        #expect(try ids(in: path) == ["j0", "j1", "j2", "j3", "j4"])
        try await waitUntil("the flush counted") { metrics.journalFlushes.withLock { $0.sizes.count } >= 1 }
        #expect(metrics.render().contains("fcm_worker_journal_flush_seconds_count"))
        #expect(journal.outstanding == 5)
        journal.release(Array(repeating: first, count: 4))
        // A writer turn after the release (one more record, to the same segment): it would
        // have deleted the segment if it took four releases for five.
        let again = journal.append(records(100..<101))
        #expect(again == first)
        try await waitUntil("the writer's next turn") { (try? ids(in: path).count) == 6 }
        #expect(FileManager.default.fileExists(atPath: path), "a segment with an uncommitted message is kept")
        journal.release([first, again])
        try await waitUntil("the committed segment deleted") { !FileManager.default.fileExists(atPath: path) }
        // Later records start a new segment.
        let third = journal.append(records(5..<6))
        #expect(third > first)
        try await waitUntil("the new segment written") { (try? ids(in: journal.path(of: third))) == ["j5"] }
        running.cancel()
        await running.value
        #expect(UpstreamJournal.segments(beside: spool).map(\.number) == [third])
    }

    /// A connection's messages wait for the end of its read (`writeAppended`), and the
    /// whole read then goes in one flush: a writer woken by the first message of a read
    /// would flush it alone, and the rest would wait for that flush and then their own.
    @Test func aConnectionsReadIsWrittenInOneFlushOnceParsed() async throws {
        let spool = try temporarySpoolPath()
        let metrics = WorkerMetrics()
        let journal = journal(spool, metrics: metrics)
        let running = Task { await journal.run(until: ShutdownSignal()) }
        defer { running.cancel() }
        let route = CCSAckRoute(label: "ccs#test")
        func read(_ indexes: Range<Int>) -> Set<Int> {
            Set(indexes.map { index in
                journal.append(payload: #"{"message_id":"r\#(index)","from":"d"}"#, connection: "ccs#test", receivedAt: Date(),
                               ack: DurableAck(messageID: "r\(index)", stanza: "", route: route))
            })
        }
        // A first read, written: the writer then waits for the next.
        let segments = read(0..<1)
        journal.writeAppended()
        let path = journal.path(of: segments.first!)
        try await waitUntil("the first read on disk") { (try? ids(in: path)) == ["r0"] }
        try await waitUntil("the writer waiting") { journal.writerIsIdle }
        #expect(read(1..<6) == segments)
        try await Task.sleep(for: .milliseconds(100))
        #expect(try ids(in: path) == ["r0"], "written before the read was parsed to its end")
        journal.writeAppended()
        try await waitUntil("the second read on disk") { (try? ids(in: path)) == ["r0", "r1", "r2", "r3", "r4", "r5"] }
        // The file shows a write before its flush is counted.
        try await waitUntil("both flushes counted") { metrics.journalFlushes.withLock { $0.sizes.sum } == 6 }
        #expect(metrics.journalFlushes.withLock { $0.sizes.count } == 2, "one flush per read")
    }

    @Test func aFullSegmentIsClosedAndDeletedOnlyWhenItsOwnMessagesCommitted() async throws {
        let spool = try temporarySpoolPath()
        let journal = journal(spool, segmentBytes: 1)
        let running = Task { await journal.run(until: ShutdownSignal()) }
        defer { running.cancel() }
        let first = journal.append(records(0..<2))
        try await waitUntil("the first segment written") { (try? ids(in: journal.path(of: first)).count) == 2 }
        // The first segment passed its size: the next write goes to a new one.
        var second = journal.append(records(2..<3))
        if second == first {
            // Appended before the writer closed the first: it was written there.
            try await waitUntil("the record written") { (try? ids(in: journal.path(of: first)).count) == 3 }
            second = journal.append(records(3..<4))
        }
        #expect(second > first)
        try await waitUntil("the second segment written") { (try? ids(in: journal.path(of: second)).isEmpty) == false }
        // Releasing the last message of a closed segment wakes the writer, which deletes it.
        journal.release(Array(repeating: first, count: (try ids(in: journal.path(of: first))).count))
        try await waitUntil("the first segment deleted") { !FileManager.default.fileExists(atPath: journal.path(of: first)) }
        #expect(FileManager.default.fileExists(atPath: journal.path(of: second)))
    }

    @Test func cancelledItWritesWhatItHoldsBeforeEnding() async throws {
        let spool = try temporarySpoolPath()
        let journal = journal(spool)
        let segment = journal.append(records(0..<100))
        let running = Task { await journal.run(until: ShutdownSignal()) }
        running.cancel()
        await running.value
        #expect(try ids(in: journal.path(of: segment)).count == 100)
    }

    @Test func newSegmentsAreNumberedAfterTheOnesLeftByAnEarlierRun() async throws {
        let spool = try temporarySpoolPath()
        for suffix in ["0000000041", "0000000007", "notanumber"] {
            #expect(FileManager.default.createFile(atPath: spool + ".journal-" + suffix, contents: Data()))
        }
        #expect(UpstreamJournal.segments(beside: spool).map(\.number) == [7, 41])
        let journal = journal(spool)
        #expect(journal.append(records(0..<1)) == 42)
    }
}
