/// A bounded multi-producer, single-consumer queue for async code.
///
/// `push` suspends while the queue holds `capacity` items (backpressure: nothing is ever
/// dropped to make room); the consumer takes items in batches.
///
/// A producer that cannot suspend (a stream's thread) uses `offer` instead: it never
/// waits, it learns whether room is left, and when there is none it stops producing (a
/// stream stops reading its socket, so TCP carries the backpressure) until `onRoom` tells it
/// the consumer took from a full queue. One read can complete several items, so such a
/// producer may put up to one read's worth past `capacity`, never more.
///
/// The one queue of items. The other, `OutboundBuffer`, is bounded in bytes rather than
/// items and is consumed by a stream's thread, which cannot suspend: it takes everything
/// at once and is woken through its `WakePipe`, and a gate there refuses some senders
/// (`CONNECTION_DRAINING`). Every wait ends on cancellation: a producer cancelled while it
/// waits for room hands its items over anyway (the queue then holds more than `capacity`
/// for a moment) rather than lose them, and a consumer cancelled while it waits gets
/// nothing.
///
/// The type is `public` and its members `package`: Swift 6.3 neither inlines nor specializes
/// the `@inlinable` members of a `package` type in other modules, which then called them
/// unspecialized, looking generic metadata up at run time at every call.
public final class BoundedQueue<Element: Sendable>: Sendable {
    @usableFromInline struct State {
        @usableFromInline var items = FIFO<Element>()
        /// Items producers hold while they wait for room, and their numbers (two queues
        /// rather than one of tuples, whose metadata costs a lookup per operation).
        @usableFromInline var held = FIFO<Element>()
        @usableFromInline var heldIDs = FIFO<UInt64>()
        @usableFromInline var producers = Waiters<Bool>()
        @usableFromInline var consumer = Waiters<Bool>()
        @usableFromInline var nextHold: UInt64 = 0
        @usableFromInline var closed = false
        /// Set by `close(refusingOffers: true)`: `offer` queues nothing more.
        @usableFromInline var refusingOffers = false
        /// Set by `takeAll`: nothing waits for room any more.
        @usableFromInline var drained = false

        @inlinable init() {}
    }

    @usableFromInline package let capacity: Int
    @usableFromInline let state = BlockingLock(State())
    /// Called (outside the lock) when the consumer took from a full queue: wakes a producer
    /// that cannot suspend and stopped producing (see `offer`).
    @usableFromInline let onRoom: (@Sendable () -> Void)?

    @inlinable package init(capacity: Int, onRoom: (@Sendable () -> Void)? = nil) {
        self.capacity = capacity
        self.onRoom = onRoom
    }

    /// For a producer that cannot suspend: runs `produce` under the queue's lock and queues
    /// what it returns, never waiting, even past `capacity`. At once with respect to
    /// `close(refusingOffers: true)`: after it, `produce` is not called at all, and whatever
    /// `produce` did for an item (a stanza's ack, say) is always matched by the item reaching
    /// the consumer. Keep `produce` short.
    ///
    /// The consumer is not woken here: `handOver()` does that, once per batch of offers (a
    /// task resumed per item of a read cost more than the item's own handling).
    @inlinable package func offer(_ produce: () -> Element?) -> BoundedQueueOffer {
        state.withLock { state -> BoundedQueueOffer in
            if state.refusingOffers { return .refused }
            if let item = produce() { state.items.append(item) }
            return .queued(hasRoom: state.items.count + state.held.count < capacity)
        }
    }

    /// Wakes a waiting consumer when anything is queued: a producer that offered a batch
    /// calls it once after the batch.
    @inlinable package func handOver() {
        state.withLock { $0.items.isEmpty ? nil : $0.consumer.removeFirst() }?.resume(returning: true)
    }

    /// True while an offer would not fill the queue (false once offers are refused).
    @inlinable package var hasRoom: Bool {
        state.withLock { !$0.refusingOffers && $0.items.count + $0.held.count < capacity }
    }

    /// True while the consumer is suspended in `take` (for tests).
    @inlinable package var hasWaitingConsumer: Bool { state.withLock { !$0.consumer.isEmpty } }

    /// Adds `item`, waiting while the queue is full.
    @inlinable package func push(_ item: Element) async {
        await push(contentsOf: CollectionOfOne(item))
    }

    /// Adds `items` in order, with one lock and at most one consumer wakeup for what fits;
    /// the rest waits for room (in order, behind producers already waiting). After
    /// `close()` items are still accepted: nothing a producer holds is lost.
    @inlinable package func push<S: Sequence>(contentsOf items: S) async where S.Element == Element {
        var iterator = items.makeIterator()
        var next = iterator.next()
        while let item = next {
            var hold: UInt64?
            let consumer = state.withLock { state -> CheckedContinuation<Bool, Never>? in
                var added = false
                var pending: Element? = item
                while let current = pending {
                    if state.held.isEmpty && (state.items.count < capacity || state.drained) {
                        state.items.append(current)
                        added = true
                        pending = iterator.next()
                    } else {
                        state.nextHold += 1
                        state.held.append(current)
                        state.heldIDs.append(state.nextHold)
                        hold = state.nextHold
                        pending = nil
                    }
                }
                return added ? state.consumer.removeFirst() : nil
            }
            consumer?.resume(returning: true)
            guard let hold else { return }
            await waitUntilAdmitted(hold)
            next = iterator.next()
        }
    }

    /// Waits until the held item `hold` is in the queue. On cancellation it is moved in at
    /// once, over capacity.
    @inlinable func waitUntilAdmitted(_ hold: UInt64) async {
        let admitted = await state.suspend(in: \.producers, cancelled: false) { state in
            state.heldIDs.contains { $0 == hold } ? nil : true
        }
        guard !admitted else { return }
        let consumer = state.withLock { state -> CheckedContinuation<Bool, Never>? in
            // Admit every item held up to and including this one, in order.
            while let first = state.heldIDs.first, first <= hold {
                _ = state.heldIDs.popFirst()
                state.items.append(state.held.popFirst()!)
            }
            return state.consumer.removeFirst()
        }
        consumer?.resume(returning: true)
    }

    /// Takes up to `maximum` items, waiting until at least one is there, the queue is closed
    /// (returns what is left, possibly nothing), `deadline` passes on `clock` (nil: the
    /// system's), or the task is cancelled (both return an empty array when nothing was there).
    @inlinable package func take(maximum: Int, deadline: ContinuousClock.Instant? = nil,
                                 clock: (any DeadlineClock)? = nil) async -> [Element] {
        var lastLook = false
        while true {
            let (items, admitted, closed, wasFull) = state.withLock { state -> ([Element], [CheckedContinuation<Bool, Never>], Bool, Bool) in
                let wasFull = state.items.count >= capacity
                var items = state.items.popFirst(maximum)
                let admitted = admitProducers(&state)
                if items.count < maximum { items += state.items.popFirst(maximum - items.count) }
                return (items, admitted, state.closed, wasFull && !items.isEmpty)
            }
            for producer in admitted { producer.resume(returning: true) }
            if wasFull, let onRoom { onRoom() }
            if !items.isEmpty || closed || lastLook || Task.isCancelled { return items }
            if let deadline, (clock?.now ?? ContinuousClock.now) >= deadline { return [] }
            let woken = await state.suspend(in: \.consumer, cancelled: false, deadline: deadline, timedOut: false, clock: clock) { state in
                state.items.count > 0 || state.closed || !state.held.isEmpty ? true : nil
            }
            // Timed out or cancelled: one more look, for what arrived meanwhile.
            if !woken { lastLook = true }
        }
    }

    /// Moves held items into the room the consumer made; returns their producers to resume.
    @inlinable func admitProducers(_ state: inout State) -> [CheckedContinuation<Bool, Never>] {
        guard !state.held.isEmpty, state.items.count < capacity else { return [] }
        while state.items.count < capacity, let held = state.held.popFirst() {
            _ = state.heldIDs.popFirst()
            state.items.append(held)
        }
        // Each producer checks whether its own item got in.
        return state.producers.removeAll()
    }

    /// True once `close()` was called.
    @inlinable package var isClosed: Bool { state.withLock { $0.closed } }

    /// True once `takeAll()` emptied it: what is pushed after that is accepted without
    /// waiting, and only another `takeAll()` takes it.
    @inlinable package var isDrained: Bool { state.withLock { $0.drained } }

    /// Number of queued items (including those producers hold while waiting for room).
    @inlinable package var count: Int { state.withLock { $0.items.count + $0.held.count } }

    /// Tells the consumer to finish: `take` no longer waits once the queue is empty, and
    /// what is queued is still taken first. With `refusingOffers`, `offer` queues nothing
    /// from now on (a stream that stopped receiving: what it refuses is not acked, so the
    /// peer sends it again); `push` still accepts, as nothing a task holds may be lost.
    @inlinable package func close(refusingOffers: Bool = false) {
        let consumer = state.withLock { state -> [CheckedContinuation<Bool, Never>] in
            state.closed = true
            if refusingOffers { state.refusingOffers = true }
            return state.consumer.removeAll()
        }
        for waiter in consumer { waiter.resume(returning: true) }
    }

    /// Closes the queue and takes everything in it, including the items producers hold
    /// while waiting for room; those producers return (their items are the caller's now),
    /// and later pushes are accepted without waiting. For a consumer giving up (shutdown).
    @inlinable package func takeAll() -> [Element] {
        let (items, producers, consumer) = state.withLock { state -> ([Element], [CheckedContinuation<Bool, Never>], [CheckedContinuation<Bool, Never>]) in
            state.closed = true
            state.drained = true
            var items = state.items.popFirst(Int.max)
            while let held = state.held.popFirst() { items.append(held) }
            state.heldIDs = FIFO()
            return (items, state.producers.removeAll(), state.consumer.removeAll())
        }
        for producer in producers { producer.resume(returning: true) }
        for waiter in consumer { waiter.resume(returning: true) }
        return items
    }

    /// Wakes a waiting consumer without adding anything (a retry became due).
    @inlinable package func poke() {
        state.withLock { $0.consumer.removeFirst() }?.resume(returning: true)
    }
}

/// What became of a `BoundedQueue.offer`.
public enum BoundedQueueOffer: Equatable, Sendable {
    /// Refused after `close(refusingOffers: true)`: the item was not produced.
    case refused
    /// Queued (if one was produced); `hasRoom` is false once the queue is full and the
    /// producer should stop until the queue's `onRoom`.
    case queued(hasRoom: Bool)
}
