import Foundation

/// State guarded by a blocking (pthread) mutex.
///
/// Unlike `Synchronization.Mutex`, which spins before it sleeps, a contended acquire here
/// sleeps at once. With more busy threads than cores (the simulator's sessions and the
/// worker on a 2-core machine), spinning only burns the CPU the lock holder needs.
package final class BlockingLock<Value>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: Value

    package init(_ value: Value) {
        self.value = value
    }

    package func withLock<Result>(_ body: (inout Value) throws -> Result) rethrows -> Result {
        lock.lock()
        defer { lock.unlock() }
        return try body(&value)
    }
}
