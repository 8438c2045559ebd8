import Synchronization
import Runtime

/// Stanzas handed from a stream's thread to one consuming task, bounded.
///
/// The thread pushes without blocking and learns from the result whether to keep reading;
/// when the inbox is full it stops reading the socket (TCP backpressure reaches the server)
/// until the consumer has taken one out, which wakes the thread through `onSpace`. One read
/// can complete several stanzas, so the inbox may hold up to one read's worth past its
/// capacity, never more.
final class StanzaInbox: Sendable {
    private struct State {
        var items = FIFO<ReceivedStanza>()
        var waiting: CheckedContinuation<[ReceivedStanza]?, Never>?
        var finished = false
        var stopped = false
    }

    let capacity: Int
    private let state = BlockingLock(State())
    private let onSpace: @Sendable () -> Void

    init(capacity: Int, onSpace: @escaping @Sendable () -> Void) {
        self.capacity = capacity
        self.onSpace = onSpace
    }

    /// What became of a pushed stanza.
    struct PushResult: Equatable {
        /// False after `stop()`: the stanza was discarded (it must not be acked).
        var accepted: Bool
        /// False when the inbox is now full (the caller pauses reading).
        var hasRoom: Bool
    }

    /// Adds a stanza for the consumer.
    @discardableResult
    func push(_ stanza: ReceivedStanza) -> PushResult {
        let (waiter, result) = state.withLock { state -> (CheckedContinuation<[ReceivedStanza]?, Never>?, PushResult) in
            if state.stopped { return (nil, PushResult(accepted: false, hasRoom: false)) }
            if let waiter = state.waiting {
                state.waiting = nil
                return (waiter, PushResult(accepted: true, hasRoom: true))
            }
            state.items.append(stanza)
            return (nil, PushResult(accepted: true, hasRoom: state.items.count < capacity))
        }
        waiter?.resume(returning: [stanza])
        return result
    }

    /// True while the consumer has room for more.
    var hasRoom: Bool { state.withLock { !$0.stopped && $0.items.count < capacity } }

    /// Refuses every further stanza (they are not acked, so CCS redelivers them) and ends
    /// the sequence once the consumer has taken what is already queued: those may have
    /// been acked by an interceptor and must not be dropped.
    func stop() {
        let waiter = state.withLock { state -> CheckedContinuation<[ReceivedStanza]?, Never>? in
            state.finished = true
            state.stopped = true
            defer { state.waiting = nil }
            return state.waiting
        }
        waiter?.resume(returning: nil)
    }

    /// True after `stop()`.
    var isStopped: Bool { state.withLock { $0.stopped } }

    /// True while the consumer is suspended in `next()`.
    var hasWaiter: Bool { state.withLock { $0.waiting != nil } }

    /// Ends the sequence after the stanzas already queued.
    func finish() {
        let waiter = state.withLock { state -> CheckedContinuation<[ReceivedStanza]?, Never>? in
            state.finished = true
            defer { state.waiting = nil }
            return state.waiting
        }
        waiter?.resume(returning: nil)
    }

    /// The next stanza, or nil once the stream has ended and everything was taken.
    /// Only one task may wait at a time.
    func next() async -> ReceivedStanza? {
        await next(maximum: 1)?.first
    }

    /// Up to `maximum` queued stanzas in arrival order (waiting for at least one), or nil
    /// once the stream has ended and everything was taken. One call per read turn rather
    /// than per stanza keeps the hand-over cheap under load. Only one task may wait at a time.
    func next(maximum: Int) async -> [ReceivedStanza]? {
        await withCheckedContinuation { continuation in
            let (items, wasFull) = state.withLock { state -> ([ReceivedStanza]??, Bool) in
                let wasFull = state.items.count >= capacity
                let items = state.items.popFirst(max(1, maximum))
                if !items.isEmpty { return (.some(items), wasFull) }
                if state.finished { return (.some(nil), false) }
                precondition(state.waiting == nil, "StanzaInbox supports one consumer at a time")
                state.waiting = continuation
                return (nil, false)
            }
            if let items { continuation.resume(returning: items) }
            if wasFull { onSpace() }
        }
    }
}
