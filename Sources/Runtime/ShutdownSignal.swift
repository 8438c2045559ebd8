/// A one-way switch from running to shutting down, observable from any task, with a
/// second step: a second request (a second SIGTERM or SIGINT) makes the shutdown urgent,
/// and whoever still waits for work to finish gives up at once.
package final class ShutdownSignal: Sendable {
    private struct State {
        var requested = false
        var requestedAt: ContinuousClock.Instant?
        var urgent = false
        var hooks: [@Sendable () -> Void] = []
        var urgentHooks: [@Sendable () -> Void] = []
        var sleepers = Waiters<Void>()
        var urgentSleepers = Waiters<Void>()
    }
    private let state = BlockingLock(State())

    package init() {}

    package var isRequested: Bool { state.withLock { $0.requested } }

    /// When shutdown was first requested (nil before): every stage's deadline counts from
    /// here, so that the whole shutdown ends within one timeout.
    package var requestedAt: ContinuousClock.Instant? { state.withLock { $0.requestedAt } }

    /// `requestedAt + timeout` (from now if not requested yet).
    package func deadline(after timeout: Duration) -> ContinuousClock.Instant {
        (requestedAt ?? .now) + timeout
    }

    /// True once shutdown was requested twice: skip every wait that is left.
    package var isUrgent: Bool { state.withLock { $0.urgent } }

    /// Flips the switch (the first time), or makes the shutdown urgent (the second time):
    /// runs the hooks of that step and wakes its sleepers.
    package func request() {
        let (hooks, sleepers) = state.withLock { state -> ([@Sendable () -> Void], [CheckedContinuation<Void, Never>]) in
            if !state.requested {
                state.requested = true
                state.requestedAt = .now
                defer { state.hooks.removeAll() }
                return (state.hooks, state.sleepers.removeAll())
            }
            guard !state.urgent else { return ([], []) }
            state.urgent = true
            defer { state.urgentHooks.removeAll() }
            return (state.urgentHooks, state.urgentSleepers.removeAll())
        }
        for hook in hooks { hook() }
        for sleeper in sleepers { sleeper.resume() }
    }

    /// Makes the shutdown urgent at once (requesting it first if needed).
    package func requestUrgently() {
        if !isRequested { request() }
        request()
    }

    /// Runs `hook` on shutdown (at once if it was already requested).
    package func onRequest(_ hook: @escaping @Sendable () -> Void) {
        let runNow = state.withLock { state -> Bool in
            if state.requested { return true }
            state.hooks.append(hook)
            return false
        }
        if runNow { hook() }
    }

    /// Runs `hook` when the shutdown becomes urgent (at once if it is).
    package func onUrgent(_ hook: @escaping @Sendable () -> Void) {
        let runNow = state.withLock { state -> Bool in
            if state.urgent { return true }
            state.urgentHooks.append(hook)
            return false
        }
        if runNow { hook() }
    }

    /// Waits until shutdown is requested, or the task is cancelled.
    package func wait() async {
        await state.suspend(in: \.sleepers, cancelled: ()) { $0.requested ? () : nil }
    }

    /// Waits until shutdown is requested, even in a cancelled task: for a part that must not
    /// go on before the request comes (the wait ends only then).
    package func waitIgnoringCancellation() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            onRequest { continuation.resume() }
        }
    }

    /// Waits until the shutdown is urgent, or the task is cancelled.
    package func waitUntilUrgent() async {
        await state.suspend(in: \.urgentSleepers, cancelled: ()) { $0.urgent ? () : nil }
    }

    /// Sleeps until `deadline`, or less if the shutdown becomes urgent or the task is cancelled.
    package func sleepUnlessUrgent(until deadline: ContinuousClock.Instant) async {
        await state.suspend(in: \.urgentSleepers, cancelled: (), deadline: deadline, timedOut: ()) { $0.urgent ? () : nil }
    }

    /// Sleeps for `duration`, or less if shutdown is requested or the task is cancelled.
    package func sleep(for duration: Duration) async {
        await state.suspend(in: \.sleepers, cancelled: (), deadline: .now + duration, timedOut: ()) { $0.requested ? () : nil }
    }
}
