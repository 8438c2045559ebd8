import Foundation

/// State guarded by a blocking (pthread) mutex.
///
/// Unlike `Synchronization.Mutex`, which spins before it sleeps, a contended acquire here
/// sleeps at once. With more busy threads than cores (the simulator's sessions and the
/// worker on a 2-core machine), spinning only burns the CPU the lock holder needs.
///
/// It is the project's one lock type. The exceptions, each for a stated reason: `Mutex`
/// inline in objects made per message (`UpstreamMessage`'s parsed cells, the v1 transport's
/// row progress), where a lock object each cost allocations on the hot path and the lock is
/// rarely contended; `ThreadCondition`'s pthread mutex, the one a condition variable needs
/// (the threads that sleep until signalled or until a deadline on the monotonic clock:
/// `DeadlineThread`, `DedicatedThread`, the upstream journal's writer).
///
/// The type is `public` and its members `package`: Swift 6.3 neither inlines nor specializes
/// the `@inlinable` members of a `package` type in other modules, which then called them
/// unspecialized, looking generic metadata up at run time at every call.
/// `@unchecked Sendable`: `value` is read and written only holding `lock`.
public final class BlockingLock<State>: @unchecked Sendable {
    @usableFromInline let lock = NSLock()
    @usableFromInline var value: State

    package init(_ value: State) {
        self.value = value
    }

    /// Runs `body` with the state, under the lock. Inlinable, so that callers in other
    /// modules get it specialized for their state.
    @inlinable
    package func withLock<Result>(_ body: (inout State) throws -> Result) rethrows -> Result {
        lock.lock()
        defer { lock.unlock() }
        return try body(&value)
    }
}
