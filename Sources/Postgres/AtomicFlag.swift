import Synchronization

/// A boolean readable from any thread.
final class AtomicFlag: Sendable {
    private let storage: Atomic<Bool>
    init(_ value: Bool) { storage = Atomic(value) }
    var value: Bool {
        get { storage.load(ordering: .acquiring) }
        set { storage.store(newValue, ordering: .releasing) }
    }
}
