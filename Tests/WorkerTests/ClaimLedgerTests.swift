import Foundation
import Testing
@testable import Outbox
@testable import Upstream
@testable import Worker

@Suite struct ClaimLedgerTests {
    private func update(_ row: Int64, _ status: OutboxUpdate.Status, acked: Bool = false) -> OutboxUpdate {
        OutboxUpdate(rowID: row, status: status, ackedAt: acked ? Date() : nil)
    }

    private func emptied(_ ledger: ClaimLedger, _ updates: [OutboxUpdate]) -> [Int64] {
        ledger.plan(updates).emptied
    }

    /// The claim a write of `rows` would name for each.
    private func claims(_ ledger: ClaimLedger, of rows: [Int64]) -> [Int64?] {
        ledger.plan(rows.map { update($0, .sent) }).claims
    }

    @Test func aWriteEmptiesAClaimOnlyWhenItGivesUpEveryRowOfIt() {
        let ledger = ClaimLedger()
        ledger.add(claim: 1, rows: [10, 11, 12])
        ledger.add(claim: 2, rows: [20])
        #expect(claims(ledger, of: [10, 20, 99]) == [1, 2, nil])
        #expect(ledger.plan([update(10, .acked), update(20, .sent), update(99, .acked)]).claims == [1, 2, nil])
        // `sent` and a receipt without its ack keep their rows; the others give them up.
        #expect(emptied(ledger, [update(10, .acked), update(11, .sent), update(12, .retry)]).isEmpty)
        #expect(emptied(ledger, [update(10, .acked), update(11, .failed), update(12, .pending)]) == [1])
        #expect(emptied(ledger, [update(20, .delivered)]).isEmpty)
        #expect(emptied(ledger, [update(20, .delivered, acked: true)]) == [2])
        // Two updates of one row count once.
        #expect(emptied(ledger, [update(10, .acked), update(10, .acked), update(11, .acked)]).isEmpty)
        // Written: rows leave, an emptied claim is forgotten, the others stay for renewal.
        let updates = [update(10, .acked), update(11, .sent), update(20, .expired)]
        ledger.written(updates, under: ledger.plan(updates))
        #expect(ledger.claimIDs == [1])
        #expect(claims(ledger, of: [10, 11, 12, 20]) == [nil, 1, 1, nil])
        #expect(emptied(ledger, [update(11, .acked), update(12, .acked)]) == [1])
    }

    @Test func aRowTakenAgainRightAfterItsRetryWasCommittedStaysWithItsNewClaim() {
        let ledger = ClaimLedger()
        ledger.add(claim: 1, rows: [10])
        let retry = [update(10, .retry)]
        let plan = ledger.plan(retry)
        #expect(plan == .init(claims: [1], emptied: [1]))
        // The retry is committed (claim 1 deleted with it); a sweep takes the row, due
        // again, under claim 2 before the write-back gets to record its write.
        ledger.add(claim: 2, rows: [10])
        ledger.written(retry, under: plan)
        #expect(claims(ledger, of: [10]) == [2], "the answer to the second send is written under claim 2")
        #expect(ledger.claimIDs == [2], "claim 2 is renewed")
        #expect(emptied(ledger, [update(10, .acked)]) == [2])
    }

    @Test func aLostClaimIsForgottenAndARowTakenAgainMovesToItsNewClaim() {
        let ledger = ClaimLedger()
        ledger.add(claim: 1, rows: [10, 11])
        ledger.add(claim: 2, rows: [20, 21])
        #expect(ledger.forget([2, 7]) == 2, "the rows of the claims it knew")
        #expect(ledger.claimIDs == [1] && claims(ledger, of: [20]) == [nil])
        // Claim 1 expired and was swept by this worker again: its rows now belong to claim 3.
        ledger.add(claim: 3, rows: [10, 11])
        #expect(ledger.claimIDs == [3], "the emptied claim is not renewed any more")
        #expect(claims(ledger, of: [10, 11]) == [3, 3])
    }

    /// The ledger against a plain model of it (each claim's set of rows), through a long
    /// random run of claims, writes (with repeated rows and rows of no claim), rows taken
    /// again under new claims and lost claims.
    @Test func aLongRandomRunAgreesWithAModelThatKeepsEachClaimsRows() {
        var random = SplitMix(seed: 32)
        let ledger = ClaimLedger()
        var claimOfRow: [Int64: Int64] = [:]
        var nextClaim: Int64 = 1
        let statuses: [OutboxUpdate.Status] = [.sent, .acked, .failed, .retry, .pending, .delivered, .expired]
        func rowsOf(_ claim: Int64) -> Set<Int64> { Set(claimOfRow.filter { $0.value == claim }.keys) }
        for _ in 0..<2_000 {
            switch random.next() % 10 {
            case 0, 1:
                let rows = (0..<(1 + random.next() % 6)).map { _ in Int64(random.next() % 40) }
                ledger.add(claim: nextClaim, rows: rows)
                for row in rows { claimOfRow[row] = nextClaim }
                nextClaim += 1
            case 2:
                let claims = (0..<(1 + random.next() % 2)).map { _ in Int64(random.next() % UInt64(nextClaim)) }
                let held = Set(claims).reduce(0) { $0 + rowsOf($1).count }
                #expect(ledger.forget(claims) == held)
                claimOfRow = claimOfRow.filter { !claims.contains($0.value) }
            default:
                let updates = (0..<(1 + random.next() % 8)).map { _ in
                    OutboxUpdate(rowID: Int64(random.next() % 44), status: statuses[Int(random.next() % 7)],
                                 ackedAt: random.next() % 2 == 0 ? Date() : nil)
                }
                let plan = ledger.plan(updates)
                #expect(plan.claims == updates.map { claimOfRow[$0.rowID] })
                var released: [Int64: Set<Int64>] = [:]
                for update in updates where ClaimLedger.releases(update) {
                    if let claim = claimOfRow[update.rowID] { released[claim, default: []].insert(update.rowID) }
                }
                #expect(plan.emptied == released.filter { rowsOf($0.key) == $0.value }.keys.sorted())
                // Sometimes a sweep takes a written row again before the write-back records it.
                if random.next() % 4 == 0, let retaken = updates.first {
                    ledger.add(claim: nextClaim, rows: [retaken.rowID])
                    claimOfRow[retaken.rowID] = nextClaim
                    nextClaim += 1
                }
                ledger.written(updates, under: plan)
                for (update, claim) in zip(updates, plan.claims) where ClaimLedger.releases(update) {
                    if let claim, claimOfRow[update.rowID] == claim { claimOfRow[update.rowID] = nil }
                }
            }
            #expect(ledger.claimIDs == Set(claimOfRow.values).sorted())
        }
    }
}
