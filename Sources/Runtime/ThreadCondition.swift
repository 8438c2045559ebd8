import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A mutex and a condition variable, for a thread that sleeps until another thread tells it
/// something changed, or until a deadline: the one condition-variable primitive of the threads
/// that sleep without a descriptor (`DeadlineThread`, `DedicatedThread`, the upstream
/// journal's writer; threads that sleep in poll(2) use `WakePipe`).
///
/// Its timed wait runs on `CLOCK_MONOTONIC`, the clock of `ContinuousClock`: a change of the
/// wall clock neither shortens nor stretches it, as it would a wait until a `Date`
/// (`NSCondition.wait(until:)`).
///
/// The waiter checks what it waits for holding the mutex, and whoever changes it signals
/// holding the mutex too (`withLock { …; signal() }`, or `wake()` after a change guarded by
/// another lock), so that no wake-up falls between the check and the wait.
/// `@unchecked Sendable`: the mutex and condition are pthread objects made for use from any
/// thread; the state they guard is the caller's, read and written holding the mutex.
package final class ThreadCondition: @unchecked Sendable {
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private let condition: UnsafeMutablePointer<pthread_cond_t>

    package init() {
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        pthread_mutex_init(mutex, nil)
        condition = .allocate(capacity: 1)
        condition.initialize(to: pthread_cond_t())
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
        pthread_cond_init(condition, &attributes)
        pthread_condattr_destroy(&attributes)
    }

    deinit {
        pthread_cond_destroy(condition)
        condition.deallocate()
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    /// Takes the mutex (for a loop that lets it go around work of its own: `unlock()`).
    package func lock() {
        pthread_mutex_lock(mutex)
    }

    /// Lets the mutex go.
    package func unlock() {
        pthread_mutex_unlock(mutex)
    }

    /// Runs `body` holding the mutex.
    package func withLock<Result>(_ body: () throws -> Result) rethrows -> Result {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body()
    }

    /// Holding the mutex: wakes the waiting thread, if one waits.
    package func signal() {
        pthread_cond_signal(condition)
    }

    /// Takes the mutex, signals and lets it go: for a change made under another lock, which
    /// the waiter checks holding this mutex.
    package func wake() {
        withLock { signal() }
    }

    /// Holding the mutex: sleeps until signalled (or woken spuriously: check again).
    package func wait() {
        pthread_cond_wait(condition, mutex)
    }

    /// Holding the mutex: sleeps until signalled, woken spuriously, or `deadline` passes on
    /// the monotonic clock. Returns false once the deadline has passed.
    @discardableResult
    package func wait(until deadline: ContinuousClock.Instant) -> Bool {
        let remaining = deadline - ContinuousClock.now
        guard remaining > .zero else { return false }
        let wait = remaining.timespecWithinADay
        var wakeAt = timespec()
        clock_gettime(CLOCK_MONOTONIC, &wakeAt)
        let nanoseconds = wakeAt.tv_nsec + wait.tv_nsec
        wakeAt.tv_sec += wait.tv_sec + nanoseconds / 1_000_000_000
        wakeAt.tv_nsec = nanoseconds % 1_000_000_000
        _ = pthread_cond_timedwait(condition, mutex, &wakeAt)
        return ContinuousClock.now < deadline
    }
}
