/// Suspends until the calling task is cancelled (a service with nothing to do until its
/// stage stops).
package func waitUntilCancelled() async {
    let never = ShutdownSignal()
    await never.wait()
}

/// Sleeps for `duration`; returns false when cancelled first.
@discardableResult
package func sleepUnlessCancelled(for duration: Duration) async -> Bool {
    do {
        try await Task.sleep(for: duration)
        return true
    } catch {
        return false
    }
}

/// Runs `body` to its end even when the calling task is cancelled, and returns its result:
/// for a wind-down that a shutdown starts by cancelling and that must not be cut short
/// (answers still arriving, acks still to flush). `body` must bound its own waits.
package func shielded<T: Sendable>(_ body: @escaping @Sendable () async -> T) async -> T {
    await Task { await body() }.value
}
