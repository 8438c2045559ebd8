import Foundation
import Postgres
import Runtime
import Testing
@testable import Worker

/// The outbox write-back lets answers that come a few milliseconds apart share one
/// transaction (a transaction per write costs PostgreSQL far more than a row does). A
/// timing test: it runs in the quiet pass.
@Suite struct OutboxWriteBackTimingTests {
    /// A write-back over a fresh outbox holding `rows` rows claimed by this worker.
    private func writeBack(rows: Int) async throws -> (OutboxWriteBack, BlockingLock<Int>, [Int64], TestDatabase) {
        let database = try await TestDatabase.make()
        let pool = PostgresPool(target: try PostgresConnectionString(database.url), size: 1)
        let ids = try await database.insertOutbox((0..<rows).map { ("token-\($0)", #"{"data":{"k":"v"}}"#) })
        let store = OutboxStore(pool: pool, workerID: "worker-1", lease: .seconds(60), transport: "xmpp")
        _ = try await store.claim(limit: rows)
        let commits = BlockingLock(0)
        let writeBack = OutboxWriteBack(store: store, logger: Logger(label: "test", minimumLevel: .critical),
                                        onCommit: { commits.withLock { $0 += 1 } })
        return (writeBack, commits, ids, database)
    }

    private func acked(_ id: Int64) -> OutboxUpdate {
        OutboxUpdate(rowID: id, status: .acked, attempts: 1, sentOn: "ccs#1.1", sentAt: Date(), ackedAt: Date())
    }

    @Test func answersAFewMillisecondsApartShareOneTransaction() async throws {
        let (writeBack, commits, ids, database) = try await writeBack(rows: 3)
        let task = Task { await writeBack.run() }
        defer { task.cancel() }
        // 3 and 5 ms after the first: past a 2 ms wait, well within the 10 ms one.
        writeBack.record([acked(ids[0])])
        try await Task.sleep(for: .milliseconds(3))
        writeBack.record([acked(ids[1])])
        try await Task.sleep(for: .milliseconds(2))
        writeBack.record([acked(ids[2])])
        #expect(await writeBack.flushed(within: .seconds(10)))
        #expect(commits.withLock { $0 } == 1, "three answers within \(OutboxWriteBack.gatherTime) went in one transaction")
        #expect(try await database.count("downstream_messages", where: "status = 'acked'") == 3)
    }
}
