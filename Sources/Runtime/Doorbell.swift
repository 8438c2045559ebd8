/// Wakes one waiting task: `ring()` from anywhere, `wait(timeout:)` in the task. A ring
/// while nobody waits is remembered, so a wakeup between checking and waiting is not lost.
package final class Doorbell: Sendable {
    private struct State {
        var rung = false
        var waiter = Waiters<Void>()
    }
    private let state = BlockingLock(State())

    package init() {}

    package func ring() {
        let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
            guard let waiter = state.waiter.removeFirst() else {
                state.rung = true
                return nil
            }
            return waiter
        }
        waiter?.resume()
    }

    /// Returns when rung (at once if rung since the last wait), after `timeout`, or when the
    /// task is cancelled.
    package func wait(timeout: Duration) async {
        await state.suspend(in: \.waiter, cancelled: (), deadline: .now + timeout, timedOut: ()) { state in
            guard state.rung else { return nil }
            state.rung = false
            return ()
        }
    }
}
