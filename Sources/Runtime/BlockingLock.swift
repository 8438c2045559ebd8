import Foundation

/// State guarded by a blocking (pthread) mutex.
///
/// Unlike `Synchronization.Mutex`, which spins before it sleeps, a contended acquire here
/// sleeps at once. With more busy threads than cores (the simulator's sessions and the
/// worker on a 2-core machine), spinning only burns the CPU the lock holder needs.
package final class BlockingLock<State>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: State

    package init(_ value: State) {
        self.value = value
    }

    package func withLock<Result>(_ body: (inout State) throws -> Result) rethrows -> Result {
        lock.lock()
        defer { lock.unlock() }
        return try body(&value)
    }
}
