/// Suspends until the calling task is cancelled (a service with nothing to do until its
/// stage stops).
package func waitUntilCancelled() async {
    let never = ShutdownSignal()
    await never.wait()
}

/// Sleeps for `duration`; returns false when cancelled first (at once if it already is).
/// Timed by `DeadlineThread`, like every timed wait, not by a sleeping `Task`.
@discardableResult
package func sleepUnlessCancelled(for duration: Duration) async -> Bool {
    let sleeper = BlockingLock(Waiters<Bool>())
    return await sleeper.suspend(in: \.self, cancelled: false, deadline: .now + duration, timedOut: true) { _ in nil }
}

/// Runs `body` to its end even when the calling task is cancelled, and returns its result:
/// for a wind-down that a shutdown starts by cancelling and that must not be cut short
/// (answers still arriving, acks still to flush). `body` must bound its own waits.
package func shielded<T: Sendable>(_ body: @escaping @Sendable () async -> T) async -> T {
    await Task { await body() }.value
}
