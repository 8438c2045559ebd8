import Synchronization

/// A count of reload requests (SIGHUP): a part that waits for its configuration to change
/// remembers the value it saw and acts when it moves, or is told at once (`onRequest`).
public final class ReloadGeneration: Sendable {
    private let count = Atomic(0)
    private let hooks = BlockingLock<[@Sendable () -> Void]>([])

    public init() {}

    /// The requests so far.
    public var value: Int { count.load(ordering: .acquiring) }

    /// Counts a reload request, then runs the hooks.
    public func request() {
        count.add(1, ordering: .releasing)
        for hook in hooks.withLock({ $0 }) { hook() }
    }

    /// Runs `hook` after every request from now on (it must not block).
    package func onRequest(_ hook: @escaping @Sendable () -> Void) {
        hooks.withLock { $0.append(hook) }
    }
}
