import Foundation
import Runtime
import Synchronization
import Transport

/// Requests of the HTTPS ingress whose messages found the pipeline's lanes full: instead of
/// a 503 at once, they wait here, in arrival order, until the lanes have room (then they are
/// queued and answered as their ack mode says) or until `maximumWait` passes (then they are
/// answered 503 `overloaded` with `Retry-After`). CCS got the same backpressure by not reading
/// a connection while the lanes were full; over HTTP the waiting request is what holds the
/// device back, and HTTP/2's stream limit and HTTP/1.1's one request at a time bound how
/// much each connection can have waiting.
///
/// A request that arrives while others wait goes behind them (never ahead of an earlier
/// request of its connection). At most `capacity` requests wait; past it, a request is
/// answered 503 at once. Nothing waiting was queued, so refusing it loses nothing.
///
/// Driven from two sides: a connection's thread adds a group and tries to let the queue
/// move at once (room may have come between its failed offer and its add), and the
/// ingress's waiting task lets it move whenever a lane had room again (the pipeline's
/// `room` doorbell) and at least every `tick`, answering the requests that waited too long.
final class IngressWaitingRoom: Sendable {
    /// The requests one connection read completed and admitted, waiting together: their
    /// messages go to the pipeline all at once, or not yet.
    struct Group {
        var work: [UpstreamWork]
        var records: [UpstreamJournal.Record]
        /// Each request's reply, and (immediate mode) its answer once queued; nil when its
        /// answer comes from its acks (journal and durable modes).
        var replies: [(reply: HTTPServerReply, whenQueued: HTTPServerResponse?)]
        let arrived: ContinuousClock.Instant
    }

    /// What to do with a group: queue it (true when it went to the pipeline) or refuse it.
    typealias Queue = (inout Group) -> Bool

    private struct State {
        var groups = FIFO<Group>()
        var requests = 0
        var stopped = false
    }

    let maximumWait: Duration
    let capacity: Int
    private let metrics: IngressMetrics
    private let state = BlockingLock(State())
    /// Whether any group waits: read without the lock on every read of every connection.
    private let occupied = Atomic(false)

    init(maximumWait: Duration, capacity: Int, metrics: IngressMetrics) {
        self.maximumWait = maximumWait
        self.capacity = capacity
        self.metrics = metrics
    }

    /// True while a group waits (a new request then waits behind it).
    var isOccupied: Bool { occupied.load(ordering: .acquiring) }

    /// How many requests wait now.
    var waitingRequests: Int { state.withLock { $0.requests } }

    /// Adds `group` behind those waiting, unless the room is full or stopped (false: the
    /// caller answers 503). A zero `maximumWait` takes nothing.
    func enter(_ group: Group) -> Bool {
        guard maximumWait > .zero else { return false }
        return state.withLock { state in
            guard !state.stopped, state.requests + group.replies.count <= capacity else { return false }
            state.groups.append(group)
            state.requests += group.replies.count
            metrics.waitingRequests.store(state.requests, ordering: .relaxed)
            occupied.store(true, ordering: .releasing)
            return true
        }
    }

    /// Lets the queue move: from the front, each group `queue` takes goes; a group that
    /// waited past `maximumWait` (or every group, once stopped) goes to `refuse`; the first
    /// group that can neither go nor be refused ends the turn (the ones behind it wait).
    /// Runs under the room's lock, so that groups leave in their order.
    func move(now: ContinuousClock.Instant = .now, queue: Queue, refuse: (Group) -> Void) {
        state.withLock { state in
            while var group = state.groups.first {
                if state.stopped || now - group.arrived >= maximumWait {
                    refuse(group)
                } else if !queue(&group) {
                    break
                }
                _ = state.groups.popFirst()
                state.requests -= group.replies.count
            }
            metrics.waitingRequests.store(state.requests, ordering: .relaxed)
            if state.groups.isEmpty { occupied.store(false, ordering: .releasing) }
        }
    }

    /// Takes no more groups; the next `move` refuses every group still waiting.
    func stop() {
        state.withLock { $0.stopped = true }
    }
}
