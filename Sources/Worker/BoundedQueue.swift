import Synchronization
import XMPP

/// A bounded multi-producer, single-consumer queue for async code.
///
/// `push` suspends while the queue holds `capacity` items (backpressure: nothing is ever
/// dropped to make room); the consumer takes items in batches.
final class BoundedQueue<Element: Sendable>: Sendable {
    private struct State {
        var items = FIFO<Element>()
        var producers: [(id: UInt64, item: Element, continuation: CheckedContinuation<Void, Never>)] = []
        var consumer: CheckedContinuation<Void, Never>?
        var nextID: UInt64 = 0
        var closed = false
        var count: Int { items.count }
    }

    let capacity: Int
    private let state = BlockingLock(State())

    init(capacity: Int) {
        self.capacity = capacity
    }

    /// Adds `item`, waiting while the queue is full. After `close()` items are still accepted
    /// (nothing a producer holds is lost) but the consumer is told to finish.
    func push(_ item: Element) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let (accepted, consumer) = state.withLock { state -> (Bool, CheckedContinuation<Void, Never>?) in
                if state.count < capacity && state.producers.isEmpty {
                    state.items.append(item)
                    defer { state.consumer = nil }
                    return (true, state.consumer)
                }
                state.nextID += 1
                state.producers.append((state.nextID, item, continuation))
                return (false, nil)
            }
            consumer?.resume()
            if accepted { continuation.resume() }
        }
    }

    /// Adds `items` in order, with one lock and at most one consumer wakeup for what fits;
    /// the rest waits for room one by one as `push` does.
    func push<S: Sequence>(contentsOf items: S) async where S.Element == Element {
        var iterator = items.makeIterator()
        var leftover: Element?
        let consumer = state.withLock { state -> CheckedContinuation<Void, Never>? in
            guard state.producers.isEmpty else { leftover = iterator.next(); return nil }
            var added = false
            while state.count < capacity, let item = iterator.next() {
                state.items.append(item)
                added = true
            }
            if state.count >= capacity { leftover = iterator.next() }
            guard added else { return nil }
            defer { state.consumer = nil }
            return state.consumer
        }
        consumer?.resume()
        while let item = leftover {
            await push(item)
            leftover = iterator.next()
        }
    }

    /// Takes up to `maximum` items, waiting until at least one is there, the queue is closed
    /// (returns what is left, possibly nothing), or `deadline` passes.
    func take(maximum: Int, deadline: ContinuousClock.Instant? = nil) async -> [Element] {
        while true {
            let (items, admitted, closed) = state.withLock { state -> ([Element], [CheckedContinuation<Void, Never>], Bool) in
                let items = state.items.popFirst(maximum)
                var admitted: [CheckedContinuation<Void, Never>] = []
                while state.count < capacity, !state.producers.isEmpty {
                    let producer = state.producers.removeFirst()
                    state.items.append(producer.item)
                    admitted.append(producer.continuation)
                }
                return (items, admitted, state.closed)
            }
            for producer in admitted { producer.resume() }
            if !items.isEmpty || closed { return items }
            if let deadline, ContinuousClock.now >= deadline { return [] }
            await waitForItems(until: deadline)
        }
    }

    /// True once `close()` was called.
    var isClosed: Bool { state.withLock { $0.closed } }

    /// Number of queued items (including producers waiting for room).
    var count: Int { state.withLock { $0.count + $0.producers.count } }

    /// Wakes the consumer so that `take` returns once the queue is empty.
    func close() {
        let consumer = state.withLock { state -> CheckedContinuation<Void, Never>? in
            state.closed = true
            defer { state.consumer = nil }
            return state.consumer
        }
        consumer?.resume()
    }

    /// Wakes a waiting consumer without adding anything (a retry became due).
    func poke() {
        let consumer = state.withLock { state -> CheckedContinuation<Void, Never>? in
            defer { state.consumer = nil }
            return state.consumer
        }
        consumer?.resume()
    }

    private func waitForItems(until deadline: ContinuousClock.Instant?) async {
        let timer: Task<Void, Never>? = deadline.map { deadline in
            Task { [weak self] in
                try? await Task.sleep(until: deadline, clock: .continuous)
                self?.poke()
            }
        }
        defer { timer?.cancel() }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let ready = state.withLock { state -> Bool in
                if state.count > 0 || state.closed || !state.producers.isEmpty { return true }
                if let deadline, ContinuousClock.now >= deadline { return true }
                state.consumer = continuation
                return false
            }
            if ready { continuation.resume() }
        }
    }
}
