import Runtime

/// What a stream's thread made of its stanzas, handed to one consuming task, bounded.
///
/// The items are type-erased here, as class references (`InboundBox`, which
/// `XMPPConnection` opens again without a dynamic cast): the stream's thread and this inbox
/// then run code compiled for one type, instead of generic code that looks its types up at
/// run time for every stanza.
///
/// The thread pushes without blocking and learns from the result whether to keep reading;
/// when the inbox is full it stops reading the socket (TCP backpressure reaches the server)
/// until the consumer has taken one out, which wakes the thread through `onSpace`. One read
/// can complete several stanzas, so the inbox may hold up to one read's worth past its
/// capacity, never more.
final class StanzaInbox: Sendable {
    typealias Item = any AnyObject & Sendable

    private struct State {
        var items = FIFO<Item>()
        var consumer = Waiters<[Item]?>()
        var finished = false
        var stopped = false
        /// The `maximum` of the consumer's waiting `next` call.
        var consumerMaximum = 1
    }

    let capacity: Int
    private let state = BlockingLock(State())
    private let onSpace: @Sendable () -> Void

    init(capacity: Int, onSpace: @escaping @Sendable () -> Void) {
        self.capacity = capacity
        self.onSpace = onSpace
    }

    /// What became of a pushed item.
    struct PushResult: Equatable {
        /// False after `stop()`: the item was discarded (its stanza must not be acked).
        var accepted: Bool
        /// False when the inbox is now full (the caller pauses reading).
        var hasRoom: Bool
    }

    /// Adds an item for the consumer.
    @discardableResult
    func push(_ item: Item) -> PushResult {
        guard push(intercepting: { item }) != nil else { return PushResult(accepted: false, hasRoom: false) }
        handOver()
        return PushResult(accepted: true, hasRoom: hasRoom)
    }

    /// Runs `intercept` and queues what it returns, at once with respect to `stop()`: after
    /// `stop()`, `intercept` is not called at all (the stanza is neither acked nor journaled:
    /// CCS redelivers it), and whatever it did for a stanza is always matched by the item
    /// reaching the consumer. (Intercepting first and pushing after left a window in which a
    /// stanza journal mode had journaled, and so would ack, was refused by a `stop()` and
    /// never handled.) Returns nil when stopped, else the push's result; `intercept` runs
    /// under the inbox's lock: keep it short.
    ///
    /// The item waits for `handOver()`, which the reader calls once per read: a waiting
    /// consumer is resumed once with all the stanzas of a read, not once per stanza (a
    /// task resumed per message cost more than the message's own handling).
    func push(intercepting intercept: () -> Item?) -> PushResult? {
        state.withLock { state -> PushResult? in
            if state.stopped { return nil }
            if let item = intercept() { state.items.append(item) }
            return PushResult(accepted: true, hasRoom: state.items.count < capacity)
        }
    }

    /// Resumes a waiting consumer with what is queued (up to its `maximum`).
    func handOver() {
        guard let handed = state.withLock({ takeForConsumer(&$0) }) else { return }
        handed.waiter.resume(returning: handed.items)
        if handed.wasFull { onSpace() }
    }

    /// Under the lock: the waiting consumer and what it is handed (up to its `maximum`),
    /// and whether the inbox was full before; nil when nothing is queued or nobody waits.
    private func takeForConsumer(_ state: inout State) -> (waiter: CheckedContinuation<[Item]?, Never>, items: [Item], wasFull: Bool)? {
        guard !state.items.isEmpty, let waiter = state.consumer.removeFirst() else { return nil }
        let wasFull = state.items.count >= capacity
        return (waiter, state.items.popFirst(max(1, state.consumerMaximum)), wasFull)
    }

    /// True while the consumer has room for more.
    var hasRoom: Bool { state.withLock { !$0.stopped && $0.items.count < capacity } }

    /// Refuses every further stanza (they are not acked, so CCS redelivers them) and ends
    /// the sequence once the consumer has taken what is already queued: those may have
    /// been acked by an interceptor and must not be dropped.
    func stop() {
        end(refusingMore: true)
    }

    /// True after `stop()`.
    var isStopped: Bool { state.withLock { $0.stopped } }

    /// True while the consumer is suspended in `next()`.
    var hasWaiter: Bool { state.withLock { !$0.consumer.isEmpty } }

    /// Ends the sequence after the items already queued.
    func finish() {
        end(refusingMore: false)
    }

    /// Ends the sequence, in one step under the lock: a waiting consumer gets what is
    /// queued, not the end, when anything is (an item pushed between a hand-over and the
    /// end, and so acked, would otherwise be left behind a consumer told the stream ended).
    private func end(refusingMore: Bool) {
        let (handed, others) = state.withLock { state in
            state.finished = true
            if refusingMore { state.stopped = true }
            return (takeForConsumer(&state), state.consumer.removeAll())
        }
        handed?.waiter.resume(returning: handed?.items)
        // One consumer at a time: any other waiter is told the end.
        for waiter in others { waiter.resume(returning: nil) }
        if handed?.wasFull == true { onSpace() }
    }

    /// The next item, or nil once the stream has ended and everything was taken (or the
    /// task was cancelled while nothing was queued).
    func next() async -> Item? {
        await next(maximum: 1)?.first
    }

    /// Up to `maximum` queued items in arrival order (waiting for at least one), or nil
    /// once the stream has ended and everything was taken, or when the task is cancelled
    /// while nothing is queued. One call per read turn rather than per stanza keeps the
    /// hand-over cheap under load. One consumer at a time.
    func next(maximum: Int) async -> [Item]? {
        var wasFull = false
        let items = await state.suspend(in: \.consumer, cancelled: nil) { state -> [Item]?? in
            wasFull = state.items.count >= capacity
            let items = state.items.popFirst(max(1, maximum))
            if !items.isEmpty { return .some(items) }
            if state.finished { return .some(nil) }
            state.consumerMaximum = maximum
            return nil
        }
        if wasFull { onSpace() }
        return items
    }
}

/// An interceptor's result for one stanza, as the inbox holds it: one allocation, as the
/// existential it replaces was for any payload larger than three words, and opened with
/// `unsafeDowncast` rather than a checked cast (only one connection's driver, with one
/// `Inbound` type, fills an inbox).
final class InboundBox<Inbound: Sendable>: Sendable {
    let value: Inbound
    init(_ value: Inbound) { self.value = value }
}
