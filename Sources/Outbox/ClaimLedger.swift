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
        var claimOfRow: [Int64: Int64] = [:]
        /// How many rows each live claim holds: those `claimOfRow` names it for. A count, not
        /// a set of rows: a set cost two hash-table changes more per row on the way through.
        var rowCount: [Int64: Int] = [:]

        /// `claim` holds one row less; a claim left without rows is forgotten.
        mutating func release(oneRowOf claim: Int64) {
            guard let index = rowCount.index(forKey: claim) else { return }
            let left = rowCount.values[index] - 1
            if left > 0 { rowCount.values[index] = left } else { rowCount.remove(at: index) }
        }
    }

    private let state = BlockingLock(State())

    package init() {}

    /// Records a claim the store just made.
    package func add(claim: Int64, rows: [Int64]) {
        state.withLock { state in
            var added = 0
            for row in rows {
                if let earlier = state.claimOfRow.updateValue(claim, forKey: row) {
                    if earlier == claim { continue }
                    // A row this worker held under a claim that expired and is gone, taken again.
                    state.release(oneRowOf: earlier)
                }
                added += 1
            }
            state.rowCount[claim, default: 0] += added
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
            var releasing: [Int64: Int] = [:]
            updates.withUnsafeBufferPointer { buffer in
                for index in buffer.indices {
                    let claim = state.claimOfRow[buffer[index].rowID]
                    claims.append(claim)
                    if let claim, Self.releases(buffer[index]) { releasing[claim, default: 0] += 1 }
                }
            }
            let emptied = releasing.compactMap { claim, count -> Int64? in
                guard let held = state.rowCount[claim], count >= held else { return nil }
                // As many updates as the claim has rows: it is emptied if they name that many
                // rows (a write may carry two updates of one row).
                var rows = Set<Int64>()
                updates.withUnsafeBufferPointer { buffer in
                    for index in buffer.indices where claims[index] == claim && Self.releases(buffer[index]) {
                        rows.insert(buffer[index].rowID)
                    }
                }
                return rows.count == held ? claim : nil
            }
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
                    guard let claim, let held = state.claimOfRow.index(forKey: buffer[index].rowID),
                          state.claimOfRow.values[held] == claim else { continue }
                    state.claimOfRow.remove(at: held)
                    state.release(oneRowOf: claim)
                }
            }
        }
    }

    /// Every live claim, for renewal.
    package var claimIDs: [Int64] { state.withLock { $0.rowCount.keys.sorted() } }

    /// Forgets `claims` (they expired and another worker's sweep took them over); returns
    /// how many rows they held.
    @discardableResult
    package func forget(_ claims: [Int64]) -> Int {
        state.withLock { state in
            var rows = 0
            var forgotten = Set<Int64>()
            for claim in claims {
                guard let held = state.rowCount.removeValue(forKey: claim) else { continue }
                rows += held
                forgotten.insert(claim)
            }
            // Rare (a lost lease), so the rows are found by going through them all.
            if !forgotten.isEmpty { state.claimOfRow = state.claimOfRow.filter { !forgotten.contains($0.value) } }
            return rows
        }
    }
}
