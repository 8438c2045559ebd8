import Runtime

/// The worker's live claims on outbox rows (rows of `outbox_claims`), and which claim holds
/// each row: what the write-back names when it writes a row (a write counts only while its
/// claim lives), which claims a write empties (deleted in the same transaction), and what
/// the outbox renews. One ledger serves both transports' stores.
///
/// A row is released from its claim by any update that gives it up: an answer that settles
/// it (acked, failed, expired, retry, or delivered with its ack), or a hand-back (pending).
/// A `sent` update, or a receipt alone, keeps it.
package final class ClaimLedger: Sendable {
    private struct State {
        package var claimOfRow: [Int64: Int64] = [:]
        package var rowsOfClaim: [Int64: Set<Int64>] = [:]
    }

    private let state = BlockingLock(State())

    package init() {}

    /// Records a claim the store just made.
    package func add(claim: Int64, rows: [Int64]) {
        state.withLock { state in
            for row in rows {
                // A row this worker held under a claim that expired and is gone, taken again.
                guard let earlier = state.claimOfRow.updateValue(claim, forKey: row), earlier != claim else { continue }
                state.rowsOfClaim[earlier]?.remove(row)
                if state.rowsOfClaim[earlier]?.isEmpty == true { state.rowsOfClaim[earlier] = nil }
            }
            state.rowsOfClaim[claim, default: []].formUnion(rows)
        }
    }

    /// Whether `update` gives its row up.
    package static func releases(_ update: OutboxUpdate) -> Bool {
        switch update.status {
        case .sent: false
        case .delivered: update.ackedAt != nil
        case .pending, .acked, .failed, .retry, .expired: true
        }
    }

    /// What a write of `updates` names, read in one step: the claim of each update's row
    /// (the write counts only under it) and the claims the write leaves without rows.
    package struct WritePlan: Equatable {
        package var claims: [Int64?]
        package var emptied: [Int64]
    }

    /// The plan for writing `updates` (see `WritePlan`).
    package func plan(_ updates: [OutboxUpdate]) -> WritePlan {
        state.withLock { state in
            // Each update is read where it lies, through the list's buffer (iterated, each was
            // copied whole: a dozen fields' reference counts up and down), here and in `written`.
            var claims: [Int64?] = []
            claims.reserveCapacity(updates.count)
            var released: [Int64: Set<Int64>] = [:]
            updates.withUnsafeBufferPointer { buffer in
                for index in buffer.indices {
                    let claim = state.claimOfRow[buffer[index].rowID]
                    claims.append(claim)
                    if let claim, Self.releases(buffer[index]) { released[claim, default: []].insert(buffer[index].rowID) }
                }
            }
            let emptied = released.compactMap { claim, rows in state.rowsOfClaim[claim]?.count == rows.count ? claim : nil }
            return WritePlan(claims: claims, emptied: emptied.sorted())
        }
    }

    /// `updates` are written under `plan`: the rows they give up leave the claims the write
    /// named, and claims left without rows are forgotten (the write deleted them). A row
    /// this worker took again under a new claim meanwhile (a sweep right after the write's
    /// commit found it due) stays with the new claim: its answer is written under that one.
    package func written(_ updates: [OutboxUpdate], under plan: WritePlan) {
        state.withLock { state in
            updates.withUnsafeBufferPointer { buffer in
                for (index, claim) in zip(buffer.indices, plan.claims) where Self.releases(buffer[index]) {
                    let row = buffer[index].rowID
                    guard let claim, state.claimOfRow[row] == claim else { continue }
                    state.claimOfRow[row] = nil
                    state.rowsOfClaim[claim]?.remove(row)
                    if state.rowsOfClaim[claim]?.isEmpty == true { state.rowsOfClaim[claim] = nil }
                }
            }
        }
    }

    /// Every live claim, for renewal.
    package var claimIDs: [Int64] { state.withLock { $0.rowsOfClaim.keys.sorted() } }

    /// Forgets `claims` (they expired and another worker's sweep took them over); returns
    /// how many rows they held.
    @discardableResult
    package func forget(_ claims: [Int64]) -> Int {
        state.withLock { state in
            var rows = 0
            for claim in claims {
                guard let held = state.rowsOfClaim.removeValue(forKey: claim) else { continue }
                rows += held.count
                for row in held where state.claimOfRow[row] == claim { state.claimOfRow[row] = nil }
            }
            return rows
        }
    }
}
