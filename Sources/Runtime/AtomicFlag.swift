import Synchronization

/// A boolean readable from any thread.
package final class AtomicFlag: Sendable {
    private let storage: Atomic<Bool>
    package init(_ value: Bool) { storage = Atomic(value) }
    package var value: Bool {
        get { storage.load(ordering: .acquiring) }
        set { storage.store(newValue, ordering: .releasing) }
    }
}
