import Foundation
import Postgres
import XMPP
import Runtime

/// Collects outbox row updates and token marks and writes them in batches: one
/// transaction per batch, one write per row however many updates it had meanwhile.
///
/// Updates are kept (and merged) until a write succeeds: while PostgreSQL is down they
/// wait and are retried with backoff, so a state change is never dropped. The buffer
/// holds at most one entry per row, and the sender claims nothing new while `backlog` is
/// large, so it stays bounded.
final class OutboxWriteBack: Sendable {
    private struct State {
        var order: [Int64] = []
        var updates: [Int64: OutboxUpdate] = [:]
        var tokens: [String: TokenMark] = [:]
        var tokenOrder: [String] = []
        var writing = false
        var stopped = false
        /// Numbers each `record` call; `committed` is the last one known to be written.
        var recorded: UInt64 = 0
        /// Rows whose only news is that they were sent, since when: held back for
        /// `sentHold`, so that the answer usually merges in and the row is written once.
        var heldSince: [Int64: ContinuousClock.Instant] = [:]
        var taken: UInt64 = 0
        var committed: UInt64 = 0
        var worker: CheckedContinuation<Bool, Never>?
    }

    private let store: OutboxStore
    private let logger: Logger
    private let state = BlockingLock(State())
    /// Called after each successful write (the sender wakes its claim loop with it).
    private let onCommit: @Sendable () -> Void
    /// How long a `sent` update waits for its answer before it is written on its own.
    let sentHold: Duration

    init(store: OutboxStore, logger: Logger, sentHold: Duration = .seconds(1), onCommit: @escaping @Sendable () -> Void = {}) {
        self.store = store
        self.logger = logger
        self.sentHold = sentHold
        self.onCommit = onCommit
    }

    /// The number of the last `record` call whose updates are written.
    var committed: UInt64 { state.withLock { $0.committed } }

    /// Rows with an update not yet written.
    var backlog: Int { state.withLock { $0.order.count } }

    /// Records updates (merged with any unwritten update of the same row). Returns the
    /// call's number: they are written once `committed` reaches it.
    @discardableResult
    func record(_ updates: [OutboxUpdate], tokens: [TokenMark] = []) -> UInt64 {
        guard !updates.isEmpty || !tokens.isEmpty else { return 0 }
        let now = ContinuousClock.now
        let (worker, number) = state.withLock { state -> (CheckedContinuation<Bool, Never>?, UInt64) in
            state.recorded += 1
            for update in updates {
                let merged: OutboxUpdate
                if let earlier = state.updates[update.rowID] {
                    merged = earlier.merged(with: update)
                } else {
                    merged = update
                    state.order.append(update.rowID)
                }
                state.updates[update.rowID] = merged
                if merged.status == .sent {
                    if state.heldSince[update.rowID] == nil { state.heldSince[update.rowID] = now }
                } else {
                    state.heldSince[update.rowID] = nil
                }
            }
            for mark in tokens {
                if state.tokens.updateValue(mark, forKey: mark.token) == nil { state.tokenOrder.append(mark.token) }
            }
            defer { state.worker = nil }
            return (state.worker, state.recorded)
        }
        worker?.resume(returning: true)
        return number
    }

    /// Writes batches until `stop()` and everything recorded before it is written.
    func run() async {
        var delay = Duration.milliseconds(100)
        while true {
            let proceed = await waitForWork()
            guard proceed else { break }
            // Let a burst of answers gather into this batch.
            try? await Task.sleep(for: .milliseconds(2))
            let (updates, tokens) = takeBatch()
            guard !updates.isEmpty || !tokens.isEmpty else {
                // Only sends waiting for their answers: look again shortly.
                try? await Task.sleep(for: .milliseconds(20))
                continue
            }
            do {
                try await store.write(updates, tokens: tokens)
                delay = .milliseconds(100)
                finishWrite(putBack: nil)
                onCommit()
            } catch {
                logger.warning("could not write \(updates.count) outbox update(s) (kept, retrying in \(delay.formattedSeconds)): \(error)")
                finishWrite(putBack: (updates, tokens))
                try? await Task.sleep(for: delay)
                delay = min(delay * 2, .seconds(5))
            }
        }
    }

    /// Takes what is to be written now: everything but the `sent` updates still within
    /// their hold (all of it once stopped). Marks a write in progress if it took anything.
    private func takeBatch() -> ([OutboxUpdate], [TokenMark]) {
        let now = ContinuousClock.now
        return state.withLock { state in
            var batch: [OutboxUpdate] = []
            var kept: [Int64] = []
            for id in state.order {
                if !state.stopped, let since = state.heldSince[id], now - since < sentHold {
                    kept.append(id)
                } else {
                    batch.append(state.updates.removeValue(forKey: id)!)
                    state.heldSince[id] = nil
                }
            }
            state.order = kept
            let tokens = state.tokenOrder.map { state.tokens[$0]! }
            state.tokens.removeAll()
            state.tokenOrder.removeAll()
            if !batch.isEmpty || !tokens.isEmpty {
                state.writing = true
                state.taken = state.recorded
            }
            return (batch, tokens)
        }
    }

    /// Waits until something is recorded; false once stopped with nothing left to write.
    private func waitForWork() async -> Bool {
        await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
            let answer = state.withLock { state -> Bool? in
                if !state.order.isEmpty || !state.tokenOrder.isEmpty { return true }
                if state.stopped { return false }
                state.worker = continuation
                return nil
            }
            if let answer { continuation.resume(returning: answer) }
        }
    }

    /// Ends `run()` once what is recorded is written (or could not be, see `flushed`).
    func stop() {
        let worker = state.withLock { state -> CheckedContinuation<Bool, Never>? in
            state.stopped = true
            defer { state.worker = nil }
            return state.worker
        }
        worker?.resume(returning: true)
    }

    /// Waits until nothing recorded is unwritten, up to `timeout`; false if some is.
    func flushed(within timeout: Duration) async -> Bool {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if state.withLock({ $0.order.isEmpty && $0.tokenOrder.isEmpty && !$0.writing }) { return true }
            try? await Task.sleep(for: .milliseconds(10))
        }
        return false
    }

    /// Ids of rows whose update is still unwritten (reported when a shutdown gives up).
    var unwrittenRows: [Int64] { state.withLock { $0.order } }

    private func finishWrite(putBack: ([OutboxUpdate], [TokenMark])?) {
        state.withLock { state in
            state.writing = false
            guard let (updates, tokens) = putBack else {
                state.committed = state.taken
                return
            }
            // Older than anything recorded meanwhile: merge the newer updates onto them.
            var order = updates.map(\.rowID)
            var merged: [Int64: OutboxUpdate] = [:]
            for update in updates { merged[update.rowID] = update }
            for id in state.order {
                if let earlier = merged[id] { merged[id] = earlier.merged(with: state.updates[id]!) } else {
                    merged[id] = state.updates[id]!
                    order.append(id)
                }
            }
            state.order = order
            state.updates = merged
            var tokenOrder = tokens.map(\.token)
            var marks: [String: TokenMark] = [:]
            for mark in tokens { marks[mark.token] = mark }
            for token in state.tokenOrder {
                if marks.updateValue(state.tokens[token]!, forKey: token) == nil { tokenOrder.append(token) }
            }
            state.tokenOrder = tokenOrder
            state.tokens = marks
        }
    }
}
