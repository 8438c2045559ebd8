import Foundation
import Testing
@testable import Worker

@Suite struct ClaimLedgerTests {
    private func update(_ row: Int64, _ status: OutboxUpdate.Status, acked: Bool = false) -> OutboxUpdate {
        OutboxUpdate(rowID: row, status: status, ackedAt: acked ? Date() : nil)
    }

    @Test func aWriteEmptiesAClaimOnlyWhenItGivesUpEveryRowOfIt() {
        let ledger = ClaimLedger()
        ledger.add(claim: 1, rows: [10, 11, 12])
        ledger.add(claim: 2, rows: [20])
        #expect(ledger.claims(of: [10, 20, 99]) == [1, 2, nil])
        // `sent` and a receipt without its ack keep their rows; the others give them up.
        #expect(ledger.claimsEmptied(by: [update(10, .acked), update(11, .sent), update(12, .retry)]).isEmpty)
        #expect(ledger.claimsEmptied(by: [update(10, .acked), update(11, .failed), update(12, .pending)]) == [1])
        #expect(ledger.claimsEmptied(by: [update(20, .delivered)]).isEmpty)
        #expect(ledger.claimsEmptied(by: [update(20, .delivered, acked: true)]) == [2])
        // Written: rows leave, an emptied claim is forgotten, the others stay for renewal.
        ledger.written([update(10, .acked), update(11, .sent), update(20, .expired)])
        #expect(ledger.claimIDs == [1])
        #expect(ledger.claims(of: [10, 11, 12, 20]) == [nil, 1, 1, nil])
        #expect(ledger.claimsEmptied(by: [update(11, .acked), update(12, .acked)]) == [1])
    }

    @Test func aLostClaimIsForgottenAndARowTakenAgainMovesToItsNewClaim() {
        let ledger = ClaimLedger()
        ledger.add(claim: 1, rows: [10, 11])
        ledger.add(claim: 2, rows: [20, 21])
        #expect(ledger.forget([2, 7]) == 2, "the rows of the claims it knew")
        #expect(ledger.claimIDs == [1] && ledger.claims(of: [20]) == [nil])
        // Claim 1 expired and was swept by this worker again: its rows now belong to claim 3.
        ledger.add(claim: 3, rows: [10, 11])
        #expect(ledger.claimIDs == [3], "the emptied claim is not renewed any more")
        #expect(ledger.claims(of: [10, 11]) == [3, 3])
    }
}
