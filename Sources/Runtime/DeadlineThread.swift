import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// One thread that runs short actions at their deadlines: the `DeadlineClock` behind every
/// timed wait (`BlockingLock.suspend`, `sleepUnlessCancelled`) outside tests that move time by
/// hand (`ManualClock`).
///
/// A `Task` sleeping for each timed wait cost a task, two turns of the cooperative pool and a
/// Dispatch timer for every wait, and most waits end early (an answer arrives, a batch fills)
/// and cancel their timer: at one connection about 7 % of the worker's CPU went there
/// (`perf`, `fcm-worker bench downstream --runs 1@20`). Here a wait costs an entry in a heap
/// under a lock. The thread is woken only when a deadline falls due, or when a deadline
/// arrives that is earlier than the one it sleeps for.
///
/// Actions run on this thread one at a time, so they must be short and never block:
/// resume a continuation, ring a doorbell. The thread sleeps on `CLOCK_MONOTONIC`, so a
/// change of the wall clock moves no deadline.
///
/// The type is `public` and its members `package` (`@usableFromInline`), so that the
/// inlinable `BlockingLock.suspend` can use it.
/// `@unchecked Sendable`: its deadlines are kept under its own lock; the thread is the only
/// one that runs their actions.
public final class DeadlineThread: DeadlineClock, @unchecked Sendable {
    /// The process's deadline thread, started on first use; it lives as long as the process.
    @usableFromInline package static let shared = DeadlineThread(name: "fcm-deadlines")

    /// Names a scheduled action, to cancel it.
    public typealias Ticket = DeadlineTicket

    private struct Entry {
        let deadline: ContinuousClock.Instant
        let id: UInt64
    }

    private enum Activity {
        /// Running actions or about to look at the heap again: it will see any new entry.
        case awake
        /// Sleeping until this deadline (nil: until signalled).
        case sleeping(until: ContinuousClock.Instant?)
    }

    // Everything below is guarded by `condition`'s mutex.
    private let condition = ThreadCondition()
    /// A binary min-heap by deadline. Cancelled entries stay until they surface or until
    /// they are most of it (`pruneIfMostlyCancelled`).
    private var heap: [Entry] = []
    private var actions: [UInt64: @Sendable () -> Void] = [:]
    private var lastID: UInt64 = 0
    private var activity = Activity.awake

    /// Starts the thread, which runs until the process ends (tests make their own;
    /// everything else uses `shared`).
    package init(name: String) {
        Thread.start(named: name, stackSize: 256 << 10) { [self] in self.loop() }
    }

    /// The system's monotonic clock.
    public var now: ContinuousClock.Instant { ContinuousClock.now }

    /// Runs `action` on the deadline thread once `deadline` has passed (at once if it has),
    /// unless `cancel` comes first.
    @discardableResult
    public func schedule(at deadline: ContinuousClock.Instant, _ action: @escaping @Sendable () -> Void) -> Ticket {
        condition.lock()
        lastID &+= 1
        let id = lastID
        actions[id] = action
        push(Entry(deadline: deadline, id: id))
        let wake: Bool
        switch activity {
        case .awake: wake = false
        case .sleeping(let until): wake = until.map { deadline < $0 } ?? true
        }
        if wake {
            activity = .awake
            condition.signal()
        }
        condition.unlock()
        return Ticket(id: id)
    }

    /// Keeps the ticket's action from running; returns true when this call stopped it, false
    /// when it had already been cancelled or the thread had already taken it to run (it then
    /// runs, or has run).
    @discardableResult
    public func cancel(_ ticket: Ticket) -> Bool {
        condition.withLock {
            guard actions.removeValue(forKey: ticket.id) != nil else { return false }
            pruneIfMostlyCancelled()
            return true
        }
    }

    /// Actions scheduled and neither run nor cancelled.
    package var scheduledCount: Int { condition.withLock { actions.count } }

    /// Entries the heap holds, cancelled ones included (for tests: however many waits are
    /// cancelled, it stays within twice `scheduledCount`, or 64 entries).
    package var storedCount: Int { condition.withLock { heap.count } }

    /// True while the thread sleeps (until a deadline or a signal), for tests.
    package var isAsleep: Bool {
        condition.withLock {
            if case .sleeping = activity { return true }
            return false
        }
    }

    private func loop() {
        condition.lock()
        while true {
            let now = ContinuousClock.now
            var due: [@Sendable () -> Void] = []
            while let first = heap.first, first.deadline <= now || actions[first.id] == nil {
                popFirst()
                if let action = actions.removeValue(forKey: first.id) { due.append(action) }
            }
            if !due.isEmpty {
                activity = .awake
                condition.unlock()
                for action in due { action() }
                condition.lock()
                continue
            }
            if let next = heap.first?.deadline {
                activity = .sleeping(until: next)
                condition.wait(until: next)
            } else {
                activity = .sleeping(until: nil)
                condition.wait()
            }
            activity = .awake
        }
    }

    // MARK: - The heap (under `condition`'s mutex)

    private func push(_ entry: Entry) {
        heap.append(entry)
        var child = heap.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard heap[child].deadline < heap[parent].deadline else { break }
            heap.swapAt(child, parent)
            child = parent
        }
    }

    private func popFirst() {
        let last = heap.removeLast()
        guard !heap.isEmpty else { return }
        heap[0] = last
        siftDown(from: 0)
    }

    private func siftDown(from start: Int) {
        var parent = start
        while true {
            let left = 2 * parent + 1
            guard left < heap.count else { return }
            var smallest = left
            if left + 1 < heap.count && heap[left + 1].deadline < heap[left].deadline { smallest = left + 1 }
            guard heap[smallest].deadline < heap[parent].deadline else { return }
            heap.swapAt(parent, smallest)
            parent = smallest
        }
    }

    /// Drops the cancelled entries once they are most of the heap: waits cancelled long
    /// before their deadline (most of them) would otherwise pile up until it passes.
    private func pruneIfMostlyCancelled() {
        guard heap.count > 64, heap.count > 2 * actions.count else { return }
        heap.removeAll { actions[$0.id] == nil }
        for index in stride(from: heap.count / 2 - 1, through: 0, by: -1) { siftDown(from: index) }
    }
}
