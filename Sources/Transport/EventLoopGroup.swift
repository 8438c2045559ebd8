import Foundation
import Runtime
import Synchronization

/// A fixed set of event loops that servers hand their accepted connections to, in turn:
/// the thread count stays the loops' however many devices connect. `shared` has one loop per
/// core (`FCM_EVENT_LOOPS` sets another number), each started the first time it is needed.
package final class EventLoopGroup: Sendable {
    /// The process's loops.
    package static let shared = EventLoopGroup(count: EventLoopGroup.defaultCount, name: "io")

    /// One per core, or `FCM_EVENT_LOOPS` (1 to 64).
    static var defaultCount: Int {
        if let text = ProcessInfo.processInfo.environment["FCM_EVENT_LOOPS"], let count = Int(text), (1...64).contains(count) { return count }
        return max(1, ProcessInfo.processInfo.activeProcessorCount)
    }

    package let count: Int
    private let name: String
    private let loops: BlockingLock<[EventLoop?]>
    private let next = Atomic(0)

    package init(count: Int, name: String) {
        self.count = max(1, count)
        self.name = name
        loops = BlockingLock([EventLoop?](repeating: nil, count: max(1, count)))
    }

    /// The next loop in turn, started if it was not; nil when it cannot be (out of
    /// descriptors): the caller then serves the connection on a thread of its own.
    package func nextLoop() -> EventLoop? {
        let index = next.add(1, ordering: .relaxed).oldValue % count
        return loops.withLock { loops -> EventLoop? in
            if let loop = loops[index] { return loop }
            let loop = try? EventLoop(name: "\(name) loop \(index)")
            loops[index] = loop
            return loop
        }
    }

    /// Streams served on the loops now.
    package var streamCount: Int { loops.withLock { $0.reduce(0) { $0 + ($1?.count ?? 0) } } }
}
