import Synchronization

/// Tasks suspended until something happens, kept in the locked state of the primitive they
/// wait on (a queue, a pool, a doorbell), in arrival order.
///
/// `BlockingLock.suspend` adds the calling task and takes it out again if the task is
/// cancelled, so that every wait built on it ends on cancellation as well as on its event.
package struct Waiters<Value: Sendable> {
    private var entries: [(id: UInt64, continuation: CheckedContinuation<Value, Never>)] = []

    package init() {}

    package var isEmpty: Bool { entries.isEmpty }
    package var count: Int { entries.count }

    mutating func append(_ id: UInt64, _ continuation: CheckedContinuation<Value, Never>) {
        entries.append((id, continuation))
    }

    /// Takes out the waiter `id`, if it still waits.
    mutating func remove(_ id: UInt64) -> CheckedContinuation<Value, Never>? {
        guard let index = entries.firstIndex(where: { $0.id == id }) else { return nil }
        return entries.remove(at: index).continuation
    }

    /// Takes out the longest-waiting task.
    package mutating func removeFirst() -> CheckedContinuation<Value, Never>? {
        entries.isEmpty ? nil : entries.removeFirst().continuation
    }

    /// Takes out every waiting task.
    package mutating func removeAll() -> [CheckedContinuation<Value, Never>] {
        defer { entries.removeAll() }
        return entries.map(\.continuation)
    }

}

/// Numbers the waits of every `Waiters`, so that a cancelled or timed-out task finds its own.
private let waitIDs = Atomic<UInt64>(0)

extension BlockingLock {
    /// Suspends the calling task until another task resumes it through the `Waiters` that
    /// `waiters` selects in the guarded state, until `deadline` passes (it then gets
    /// `timedOut`), or until the task is cancelled (it then gets `cancelled`).
    ///
    /// `ready` runs under the lock first: a non-nil result is returned at once without
    /// waiting.
    package func suspend<Value: Sendable>(
        in waiters: any WritableKeyPath<State, Waiters<Value>> & Sendable, cancelled: Value,
        deadline: ContinuousClock.Instant? = nil, timedOut: Value? = nil,
        unless ready: (inout State) -> Value?
    ) async -> Value {
        let id = waitIDs.add(1, ordering: .relaxed).newValue
        let timer: Task<Void, Never>? = deadline.map { deadline in
            Task { [self] in
                guard (try? await Task.sleep(until: deadline, clock: .continuous)) != nil else { return }
                withLock { $0[keyPath: waiters].remove(id) }?.resume(returning: timedOut ?? cancelled)
            }
        }
        defer { timer?.cancel() }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Value, Never>) in
                let now = withLock { state -> Value? in
                    if let value = ready(&state) { return value }
                    // Checked under the lock: a cancellation after it finds the waiter below.
                    if Task.isCancelled { return cancelled }
                    if let deadline, ContinuousClock.now >= deadline { return timedOut ?? cancelled }
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
