import Synchronization

/// A count of reload requests (SIGHUP): a part that waits for its configuration to change
/// remembers the value it saw and acts when it moves.
public final class ReloadGeneration: Sendable {
    private let count = Atomic(0)

    public init() {}

    /// The requests so far.
    public var value: Int { count.load(ordering: .acquiring) }

    /// Counts a reload request.
    public func request() {
        count.add(1, ordering: .releasing)
    }
}
