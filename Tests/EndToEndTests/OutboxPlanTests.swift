import Foundation
import Postgres
import Testing
@testable import Worker

/// The outbox statements run as prepared statements, whose generic plans know none of
/// their parameters: those plans must not read the whole table, which grows with every
/// message sent until it is pruned.
@Suite struct OutboxPlanTests {
    @Test func theClaimsGenericPlanReadsIndexesNotTheWholeTable() async throws {
        let database = try await TestDatabase.make()
        let connection = try await database.connect()
        defer { Task { await connection.close() } }
        _ = try await connection.execute("""
            INSERT INTO downstream_messages (target, payload)
            SELECT 'token-' || g, '{"data":{"n":"1"}}'::jsonb FROM generate_series(1, 20000) AS g
            """)
        _ = try await connection.execute("ANALYZE downstream_messages")
        _ = try await connection.execute("SET plan_cache_mode = force_generic_plan")
        _ = try await connection.execute("PREPARE claim(text, bigint, float8, text) AS " + OutboxStore.claimSQL)
        let plan = try await connection.query("EXPLAIN EXECUTE claim('worker-1', 100, 60, 'xmpp')")
            .compactMap { $0.string(0) }.joined(separator: "\n")
        #expect(plan.contains("downstream_messages_claimable"), "due rows are found through the claimable index:\n\(plan)")
        #expect(!plan.contains("Seq Scan on downstream_messages"), "a claim must not read the whole outbox:\n\(plan)")
        // The plan claims what it should.
        let claimed = try await connection.query("EXECUTE claim('worker-1', 100, 60, 'xmpp')")
        #expect(claimed.count == 100)
        #expect(claimed.map { $0.int(0) ?? 0 } == Array(1...100))
        #expect(try await database.count("downstream_messages", where: "status = 'sending' AND claimed_by = 'worker-1'") == 100)
    }
}
