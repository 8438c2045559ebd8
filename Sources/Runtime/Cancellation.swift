/// Sleeps for `duration` on `clock`; returns false when cancelled first (at once if it
/// already is). Timed by the clock (`DeadlineThread` unless a test moves time by hand), like
/// every timed wait, not by a sleeping `Task`.
@discardableResult
package func sleepUnlessCancelled(for duration: Duration, clock: any DeadlineClock = DeadlineThread.shared) async -> Bool {
    let sleeper = BlockingLock(Waiters<Bool>())
    return await sleeper.suspend(in: \.self, cancelled: false, deadline: clock.now + duration, timedOut: true, clock: clock) { _ in nil }
}

/// Runs `body` as a child task and returns its result; once `stop` is requested (or the
/// calling task is cancelled), `body` is cancelled, and its result is still awaited. The
/// structured form of keeping a task to cancel it later: a service whose graceful end is to
/// stop at once, or a part of one that must stop when its deadline passes.
package func cancellingOnRequest<T: Sendable>(_ stop: ShutdownSignal, _ body: @escaping @Sendable () async -> T) async -> T {
    await withTaskGroup(of: T?.self) { group in
        group.addTask { await body() }
        // Returns nil once `stop` is requested, or when cancelled because `body` returned.
        group.addTask {
            await stop.wait()
            return nil
        }
        var result: T?
        while let next = await group.next() {
            group.cancelAll()
            if let value = next { result = value }
        }
        return result!
    }
}

/// `cancellingOnRequest` for a throwing `body`: its error is rethrown.
package func cancellingOnRequest<T: Sendable>(_ stop: ShutdownSignal, _ body: @escaping @Sendable () async throws -> T) async throws -> T {
    let result: Result<T, any Error> = await cancellingOnRequest(stop) {
        do { return .success(try await body()) } catch { return .failure(error) }
    }
    return try result.get()
}
