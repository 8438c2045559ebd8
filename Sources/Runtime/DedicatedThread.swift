import Foundation
import Synchronization

/// A thread of its own that runs submitted jobs one at a time, in submission order.
///
/// Blocking C calls (libpq, HTTPS over OpenSSL) run here instead of on Swift's cooperative pool; `run(_:)`
/// bridges each job to async/await. The thread ends once `shutdown()` is called and the
/// jobs already queued have run.
package final class DedicatedThread: Sendable {
    private struct State {
        var jobs: [@Sendable () -> Void] = []
        var stopping = false
    }
    private let state = BlockingLock(State())
    private let wakeup = ThreadCondition()

    package init(name: String) {
        Thread.start(named: name) { [self] in self.loop() }
    }

    /// Runs `body` on this thread and returns its result; the calling task suspends meanwhile.
    package func run<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            let accepted = submit { continuation.resume(with: Result { try body() }) }
            if !accepted {
                continuation.resume(throwing: CancellationError())
            }
        }
    }

    /// Queues `job`; false when the thread is shutting down (the job will not run).
    @discardableResult
    package func submit(_ job: @escaping @Sendable () -> Void) -> Bool {
        let accepted = state.withLock { state -> Bool in
            if state.stopping { return false }
            state.jobs.append(job)
            return true
        }
        if accepted { wakeup.wake() }
        return accepted
    }

    /// Lets the thread finish the queued jobs and end.
    package func shutdown() {
        state.withLock { $0.stopping = true }
        wakeup.wake()
    }

    private func loop() {
        while true {
            wakeup.lock()
            var next: [@Sendable () -> Void] = []
            var stop = false
            while true {
                (next, stop) = state.withLock { state in
                    let jobs = state.jobs
                    state.jobs.removeAll(keepingCapacity: true)
                    return (jobs, state.stopping)
                }
                if !next.isEmpty || stop { break }
                wakeup.wait()
            }
            wakeup.unlock()
            for job in next { job() }
            if stop && next.isEmpty { return }
        }
    }
}
