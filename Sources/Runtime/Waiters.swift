import Synchronization

/// Tasks suspended until something happens, kept in the locked state of the primitive they
/// wait on (a queue, a pool, a doorbell), in arrival order.
///
/// `BlockingLock.suspend` adds the calling task and takes it out again if the task is
/// cancelled, so that every wait built on it ends on cancellation as well as on its event.
///
/// The type is `public` and its members `package`: Swift 6.3 neither inlines nor specializes
/// the `@inlinable` members of a `package` type in other modules, which then called them
/// unspecialized, looking generic metadata up at run time at every call.
public struct Waiters<Value: Sendable> {
    // Two arrays rather than one of (id, continuation) tuples: a tuple element type makes
    // every array operation look its metadata up at run time.
    @usableFromInline var ids: [UInt64] = []
    @usableFromInline var continuations: [CheckedContinuation<Value, Never>] = []

    @inlinable package init() {}

    @inlinable package var isEmpty: Bool { ids.isEmpty }
    @inlinable package var count: Int { ids.count }

    @inlinable mutating func append(_ id: UInt64, _ continuation: CheckedContinuation<Value, Never>) {
        ids.append(id)
        continuations.append(continuation)
    }

    /// Takes out the waiter `id`, if it still waits.
    @inlinable mutating func remove(_ id: UInt64) -> CheckedContinuation<Value, Never>? {
        guard let index = ids.firstIndex(of: id) else { return nil }
        ids.remove(at: index)
        return continuations.remove(at: index)
    }

    /// Takes out the longest-waiting task.
    @inlinable package mutating func removeFirst() -> CheckedContinuation<Value, Never>? {
        guard !ids.isEmpty else { return nil }
        ids.removeFirst()
        return continuations.removeFirst()
    }

    /// Takes out every waiting task.
    @inlinable package mutating func removeAll() -> [CheckedContinuation<Value, Never>] {
        guard !ids.isEmpty else { return [] }
        ids.removeAll()
        defer { continuations.removeAll() }
        return continuations
    }
}

/// Numbers the waits of every `Waiters`, so that a cancelled or timed-out task finds its own.
@usableFromInline let waitIDs = Atomic<UInt64>(0)

extension BlockingLock {
    /// Suspends the calling task until another task resumes it through the `Waiters` that
    /// `waiters` selects in the guarded state, until `deadline` passes (it then gets
    /// `timedOut`), or until the task is cancelled (it then gets `cancelled`). The deadline
    /// is on `clock` (nil: the system's, `DeadlineThread.shared`; a test may move time by hand).
    ///
    /// `ready` runs under the lock first: a non-nil result is returned at once without
    /// waiting.
    @inlinable
    package func suspend<Value: Sendable>(
        in waiters: any WritableKeyPath<State, Waiters<Value>> & Sendable, cancelled: Value,
        deadline: ContinuousClock.Instant? = nil, timedOut: Value? = nil, clock: (any DeadlineClock)? = nil,
        unless ready: (inout State) -> Value?
    ) async -> Value {
        let id = waitIDs.add(1, ordering: .relaxed).newValue
        // The clock ends the wait; a wait that ends first takes its entry back. (Looked up
        // only for a timed wait: most waits are not.)
        let timer = deadline.map { deadline -> (clock: any DeadlineClock, ticket: DeadlineTicket) in
            let clock = clock ?? DeadlineThread.shared
            return (clock, clock.schedule(at: deadline) { [self] in
                withLock { $0[keyPath: waiters].remove(id) }?.resume(returning: timedOut ?? cancelled)
            })
        }
        defer { if let timer { timer.clock.cancel(timer.ticket) } }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Value, Never>) in
                let now = withLock { state -> Value? in
                    if let value = ready(&state) { return value }
                    // Checked under the lock: a cancellation after it finds the waiter below.
                    if Task.isCancelled { return cancelled }
                    if let deadline, let timer, timer.clock.now >= deadline { return timedOut ?? cancelled }
                    state[keyPath: waiters].append(id, continuation)
                    return nil
                }
                if let now { continuation.resume(returning: now) }
            }
        } onCancel: {
            withLock { $0[keyPath: waiters].remove(id) }?.resume(returning: cancelled)
        }
    }
}
