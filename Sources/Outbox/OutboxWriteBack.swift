import Foundation
import Postgres
import Runtime

/// Collects outbox row updates and token marks from both transports and writes them in
/// batches: one transaction per batch, one write per row however many updates it had
/// meanwhile.
///
/// Updates are kept (and merged) until a write succeeds: while PostgreSQL is down they
/// wait and are retried with backoff, so a state change is never dropped while the worker
/// runs. The buffer holds at most one entry per row, and the senders claim nothing new
/// while `backlog` is large, so it stays bounded. At shutdown `stop()` makes `run()`
/// write everything and return; cancelling `run()` gives up at once (the rows it could not
/// write keep their claim until the lease lapses, and are then sent again).
package final class OutboxWriteBack: Sendable {
    private struct State {
        package var order: [Int64] = []
        package var updates: [Int64: Entry] = [:]
        package var tokens: [String: TokenMark] = [:]
        package var tokenOrder: [String] = []
        package var writing = false
        package var stopped = false
        /// Numbers each `record` call; `committed` is the last one known to be written.
        package var recorded: UInt64 = 0
        /// How many entries are held (`Entry.heldSince`).
        package var held = 0
        package var taken: UInt64 = 0
        package var committed: UInt64 = 0
        package var worker = Waiters<Void>()
        /// `run()` while it lets a batch gather: woken early once `gatherRows` are there.
        package var gatherer = Waiters<Void>()
        package var flushWaiters = Waiters<Bool>()

        package var isFlushed: Bool { order.isEmpty && tokenOrder.isEmpty && !writing }

        /// Merges `update` into its row's entry, or makes one; a `sent` update is held from
        /// `since`. True when the writer should hear of it: news other than a send, or the
        /// first hold when nothing was held (`wasHolding`).
        mutating func record(_ update: OutboxUpdate, since: FixedLayoutInstant, wasHolding: Bool) -> Bool {
            guard let index = updates.index(forKey: update.rowID) else {
                var entry = Entry(update: update)
                let news = entry.hold(since: since, held: &held, wasHolding: wasHolding)
                updates[update.rowID] = entry
                order.append(update.rowID)
                return news
            }
            // Merged in place: one lookup and one access, and the kept entry is not copied out
            // and back.
            return updates.values[index].merge(update, since: since, held: &held, wasHolding: wasHolding)
        }
    }

    /// A row's unwritten update, and since when it is held back: a row whose only news is
    /// that it was sent waits `sentHold` for its answer to merge in, so that it is written
    /// once. (One table for both: a message's send and its answer each cost one lookup.)
    private struct Entry {
        var update: OutboxUpdate
        /// Set while `update` is a `sent` one (a `FixedLayoutInstant`, so that the entry's
        /// layout is known when compiled and its copies are inline).
        var heldSince: FixedLayoutInstant? = nil

        /// `State.record` of an update to a row that has an entry.
        mutating func merge(_ later: OutboxUpdate, since: FixedLayoutInstant, held: inout Int, wasHolding: Bool) -> Bool {
            update.merge(later)
            return hold(since: since, held: &held, wasHolding: wasHolding)
        }

        /// Holds the entry from `since` while its update is a `sent` one (counted in
        /// `held`), and lets it go otherwise. True when the writer should hear of it: news
        /// other than a send, or the first hold when nothing was held (`wasHolding`).
        mutating func hold(since: FixedLayoutInstant, held: inout Int, wasHolding: Bool) -> Bool {
            if update.status == .sent {
                guard heldSince == nil else { return false }
                heldSince = since
                held += 1
                return !wasHolding
            }
            if heldSince != nil {
                heldSince = nil
                held -= 1
            }
            return true
        }
    }

    private let store: OutboxStore
    private let logger: Logger
    private let state = BlockingLock(State())
    /// Called after each successful write (the senders wake their claim loops with it).
    private let onCommit: @Sendable () -> Void
    /// How long a `sent` update waits for its answer before it is written on its own.
    package let sentHold: Duration
    /// How long a write waits for more updates to join it, unless `gatherRows` are there
    /// (or the write-back is stopping). Sending does not wait for the write: a row's
    /// answer is kept in memory and merged meanwhile; only its status in the table shows
    /// it this much later. Measured: at 1 connection × 20 ms (5,000 msgs/s) PostgreSQL's
    /// CPU per message 44 → 38 µs, the worker's 43 → 38 µs, against a 2 ms wait; 20 ms with
    /// claims of 100 rows or more (`XMPPTransport.claimThreshold`) against 10 ms and 50:
    /// PostgreSQL's CPU per message 6–30 % less at 1@20 and 4@20 in paired runs.
    package let gatherTime: Duration
    package let gatherRows: Int
    /// What the holds and the gathering are timed by.
    private let clock: any DeadlineClock

    package init(store: OutboxStore, logger: Logger, sentHold: Duration = .seconds(1), gatherTime: Duration = .milliseconds(20),
         gatherRows: Int = 500, clock: any DeadlineClock = DeadlineThread.shared, onCommit: @escaping @Sendable () -> Void = {}) {
        self.gatherTime = gatherTime
        self.clock = clock
        self.gatherRows = gatherRows
        self.store = store
        self.logger = logger
        self.sentHold = sentHold
        self.onCommit = onCommit
    }

    /// The number of the last `record` call whose updates are written.
    package var committed: UInt64 { state.withLock { $0.committed } }

    /// Rows with an update not yet written.
    package var backlog: Int { state.withLock { $0.order.count } }

    /// True while `run()` waits for a batch to gather.
    package var isGathering: Bool { state.withLock { !$0.gatherer.isEmpty } }

    /// Records updates (merged with any unwritten update of the same row). Returns the
    /// call's number: they are written once `committed` reaches it.
    @discardableResult
    package func record(_ updates: [OutboxUpdate], tokens: [TokenMark] = []) -> UInt64 {
        guard !updates.isEmpty || !tokens.isEmpty else { return 0 }
        let now = clock.now
        let (worker, gatherer, number) = state.withLock { state -> (CheckedContinuation<Void, Never>?, CheckedContinuation<Void, Never>?, UInt64) in
            state.recorded += 1
            // News that only rows were sent waits for its hold anyway: no need to wake the
            // writer, unless nothing was held before (it may sleep until anything comes).
            var writable = !tokens.isEmpty
            let wasHolding = state.held > 0
            let since = FixedLayoutInstant(now)
            // Each update is read where it lies, through the list's buffer: iterated, each was
            // copied whole first (a dozen fields' reference counts up and down).
            updates.withUnsafeBufferPointer { buffer in
                for index in buffer.indices where state.record(buffer[index], since: since, wasHolding: wasHolding) { writable = true }
            }
            for mark in tokens {
                if state.tokens.updateValue(mark, forKey: mark.token) == nil { state.tokenOrder.append(mark.token) }
            }
            return (writable ? state.worker.removeFirst() : nil, state.order.count >= gatherRows ? state.gatherer.removeFirst() : nil,
                    state.recorded)
        }
        worker?.resume()
        gatherer?.resume()
        return number
    }

    /// Writes batches until `stop()` and everything recorded is written, or until cancelled.
    package func run() async {
        var outage = Backoff.outage(base: .milliseconds(100), cap: .seconds(5))
        while !Task.isCancelled {
            guard let wake = nextWake() else { return }
            if let wake {
                // Only sends waiting for their answers: wait for news or the first hold to end.
                await state.suspend(in: \.worker, cancelled: (), deadline: wake, timedOut: (), clock: clock) { state in
                    state.stopped || state.order.contains { state.updates[$0]?.heldSince == nil } || !state.tokenOrder.isEmpty ? () : nil
                }
                continue
            }
            // Let answers gather into this batch: a transaction per write costs PostgreSQL
            // far more than a row does, and at a moderate rate answers come a few at a
            // time (a 2 ms wait made transactions of about 20 rows at 5,000 msgs/s). At least
            // 2 ms, as under load a batch is what those bring; then one wait, ended early by
            // `record` once `gatherRows` are there (polling every 2 ms cost ten timer wakeups
            // a batch: the worker's CPU per message at 1@20 fell about 10 %).
            let gatherUntil = clock.now + gatherTime
            await sleepUnlessCancelled(for: .milliseconds(2), clock: clock)
            await state.suspend(in: \.gatherer, cancelled: (), deadline: gatherUntil, timedOut: (), clock: clock) { state in
                state.stopped || state.order.count >= gatherRows ? () : nil
            }
            let (updates, tokens) = takeBatch()
            guard !updates.isEmpty || !tokens.isEmpty else { continue }
            do {
                try await store.write(updates, tokens: tokens)
                outage.reset()
                finishWrite(putBack: nil)
                onCommit()
            } catch {
                finishWrite(putBack: (updates, tokens))
                guard !Task.isCancelled else { return }
                let delay = outage.next()
                logger.warning("could not write \(updates.count) outbox update(s) (kept, retrying in \(delay.formattedSeconds)): \(error)")
                await sleepUnlessCancelled(for: delay, clock: clock)
            }
        }
    }

    /// What `run` waits for next: nil to end (stopped, all written), `.some(nil)` to write
    /// now, `.some(instant)` to wait for news until then (nothing to write but held
    /// `sent` updates; `distantFuture` when there is nothing at all).
    private func nextWake() -> ContinuousClock.Instant?? {
        state.withLock { state -> ContinuousClock.Instant?? in
            if state.stopped && state.isFlushed { return nil }
            if state.stopped || !state.tokenOrder.isEmpty { return .some(nil) }
            let now = clock.now
            var earliest: ContinuousClock.Instant?
            for id in state.order {
                guard let since = state.updates[id]?.heldSince?.instant else { return .some(nil) }
                if now - since >= sentHold { return .some(nil) }
                earliest = min(earliest ?? since + sentHold, since + sentHold)
            }
            return .some(earliest ?? now + .seconds(3600))
        }
    }

    /// Takes what is to be written now: everything but the `sent` updates still within
    /// their hold (all of it once stopped). Marks a write in progress if it took anything.
    private func takeBatch() -> ([OutboxUpdate], [TokenMark]) {
        let now = clock.now
        return state.withLock { state in
            var batch: [OutboxUpdate] = []
            var kept: [Int64] = []
            for id in state.order {
                if !state.stopped, let since = state.updates[id]?.heldSince?.instant, now - since < sentHold {
                    kept.append(id)
                } else {
                    let entry = state.updates.removeValue(forKey: id)!
                    if entry.heldSince != nil { state.held -= 1 }
                    batch.append(entry.update)
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

    /// Makes `run()` write everything recorded (held updates too) and then return.
    package func stop() {
        let waiting = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.stopped = true
            return [state.worker.removeFirst(), state.gatherer.removeFirst()].compactMap { $0 }
        }
        for continuation in waiting { continuation.resume() }
    }

    /// Waits until nothing recorded is unwritten, up to `timeout`; false if some is.
    package func flushed(within timeout: Duration) async -> Bool {
        await state.suspend(in: \.flushWaiters, cancelled: false, deadline: clock.now + timeout, timedOut: false, clock: clock) { state in
            state.isFlushed ? true : nil
        }
    }

    /// Ids of rows whose update is still unwritten (reported when a shutdown gives up).
    package var unwrittenRows: [Int64] { state.withLock { $0.order } }

    private func finishWrite(putBack: ([OutboxUpdate], [TokenMark])?) {
        let flushWaiters = state.withLock { state -> [CheckedContinuation<Bool, Never>] in
            state.writing = false
            guard let (updates, tokens) = putBack else {
                state.committed = state.taken
                return state.isFlushed ? state.flushWaiters.removeAll() : []
            }
            // Older than anything recorded meanwhile: merge the newer updates onto them.
            // A row recorded again meanwhile keeps its hold, if the newer update has one.
            var order = updates.map(\.rowID)
            var merged: [Int64: Entry] = [:]
            for update in updates { merged[update.rowID] = Entry(update: update) }
            for id in state.order {
                let newer = state.updates[id]!
                if let earlier = merged[id] {
                    merged[id] = Entry(update: earlier.update.merged(with: newer.update), heldSince: newer.heldSince)
                } else {
                    merged[id] = newer
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
            return []
        }
        for waiter in flushWaiters { waiter.resume(returning: true) }
    }
}
