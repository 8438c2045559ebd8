internal import CSystem
import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif
import Runtime

/// One thread serving many streams: an epoll(7) set of their sockets (level-triggered), one
/// eventfd through which other threads wake it, one timerfd armed for the earliest of its
/// streams' deadlines (a heap of them: no thread per timed wait), and one read buffer for
/// them all. A `StreamLoop` started on it (`StreamLoop.init(on:)`) turns here whenever its
/// socket is ready, it is woken, or its deadline passes; its driver runs on this thread,
/// exactly as on a thread of its own.
///
/// `@unchecked Sendable`: other threads reach it only through `wake(_:)` and `register(_:)`
/// (the lock-guarded `incoming` list and the eventfd); the rest is its thread's.
package final class EventLoop: @unchecked Sendable {
    /// A timer entry: when, for which stream, and the stream's timer generation then (an
    /// entry whose generation is stale was replaced and is skipped).
    private struct Timer: Comparable {
        let due: ContinuousClock.Instant
        let id: UInt64
        let generation: UInt64
        static func < (a: Timer, b: Timer) -> Bool { a.due < b.due }
    }

    let name: String
    private let epoll: Int32
    private let wakeFD: Int32
    private let timerFD: Int32
    /// Streams woken or registered from other threads, taken at the loop's next turn.
    private let incoming = BlockingLock<(woken: [StreamLoop], new: [StreamLoop])>(([], []))
    /// An eventfd write is on its way (cleared by the loop before it takes `incoming`).
    private let wakePending = Atomic(false)
    /// The loop's thread (`pthread_self()`), 0 until it runs.
    private let thread = Atomic<UInt>(0)
    private let streamCount = Atomic(0)

    // The loop's thread only.
    private var streams: [UInt64: StreamLoop] = [:]
    private var nextID: UInt64 = 2
    private var timers = Heap<Timer>()
    private var armedFor: ContinuousClock.Instant?
    /// Streams to turn on the next pass (woken on this thread, or wanting another turn).
    private var ready: [StreamLoop] = []
    let readBuffer: UnsafeMutableRawBufferPointer

    private static let wakeID: UInt64 = 0
    private static let timerID: UInt64 = 1

    /// Starts the loop's thread.
    /// - Throws: `TransportError.connectionLost` when its descriptors cannot be made.
    package init(name: String) throws(TransportError) {
        self.name = name
        epoll = fcm_epoll_create()
        wakeFD = fcm_eventfd()
        timerFD = fcm_timerfd()
        readBuffer = UnsafeMutableRawBufferPointer.allocate(byteCount: StreamLoop.recordSize, alignment: 16)
        guard epoll >= 0, wakeFD >= 0, timerFD >= 0 else {
            let reason = String(cString: strerror(errno))
            for fd in [epoll, wakeFD, timerFD] where fd >= 0 { close(fd) }
            readBuffer.deallocate()
            throw .connectionLost("\(name): cannot make an event loop: \(reason)")
        }
        _ = fcm_epoll_ctl(epoll, 1, wakeFD, fcm_epoll_in(), Self.wakeID)
        _ = fcm_epoll_ctl(epoll, 1, timerFD, fcm_epoll_in(), Self.timerID)
        Thread.start(named: name) { [self] in run() }
    }

    /// Streams being served now.
    package var count: Int { streamCount.load(ordering: .relaxed) }

    var isCurrentThread: Bool { thread.load(ordering: .relaxed) == UInt(pthread_self()) }

    // MARK: - From any thread

    /// Takes `stream` on: it starts (its handshake) on the loop's thread.
    func register(_ stream: StreamLoop) {
        streamCount.add(1, ordering: .relaxed)
        incoming.withLock { $0.new.append(stream) }
        signal()
    }

    /// Makes `stream` turn soon. On the loop's thread it is queued for the next pass.
    func wake(_ stream: StreamLoop) {
        if isCurrentThread {
            markReady(stream)
            return
        }
        guard stream.claimWake() else { return }
        incoming.withLock { $0.woken.append(stream) }
        signal()
    }

    private func signal() {
        guard !wakePending.exchange(true, ordering: .acquiringAndReleasing) else { return }
        var one: UInt64 = 1
        _ = write(wakeFD, &one, 8)
    }

    // MARK: - For its streams (loop thread)

    /// Queues `stream` for a turn on the next pass (once, however often asked).
    func markReady(_ stream: StreamLoop) {
        guard !stream.isQueuedToTurn else { return }
        stream.isQueuedToTurn = true
        ready.append(stream)
    }

    /// Watches `fd` for `events` (0: not at all) on behalf of the stream numbered `id`.
    func watch(_ fd: Int32, id: UInt64, events: UInt32, registered: inout Bool) {
        if events == 0 {
            if registered { _ = fcm_epoll_ctl(epoll, 2, fd, 0, id) }
            registered = false
        } else if registered {
            _ = fcm_epoll_ctl(epoll, 3, fd, events, id)
        } else {
            registered = fcm_epoll_ctl(epoll, 1, fd, events, id) == 0
        }
    }

    /// Sets when the stream numbered `id` must turn next.
    func schedule(id: UInt64, at due: ContinuousClock.Instant, generation: UInt64) {
        timers.insert(Timer(due: due, id: id, generation: generation))
    }

    /// The stream ended: it is no longer watched or turned.
    func unregister(id: UInt64) {
        if streams.removeValue(forKey: id) != nil { streamCount.add(-1, ordering: .relaxed) }
    }

    // MARK: - The loop

    private func run() {
        thread.store(UInt(pthread_self()), ordering: .relaxed)
        var events = [fcm_epoll_event](repeating: fcm_epoll_event(), count: 256)
        while true {
            let timeout: Int32 = ready.isEmpty ? -1 : 0
            armTimer()
            let count = fcm_epoll_wait(epoll, &events, Int32(events.count), timeout)
            if count < 0 && errno != EINTR { return }
            var woken = false
            for index in 0..<max(0, Int(count)) {
                let event = events[index]
                switch event.data {
                case Self.wakeID: woken = true
                case Self.timerID:
                    var expirations: UInt64 = 0
                    _ = read(timerFD, &expirations, 8)
                    armedFor = nil
                default:
                    guard let stream = streams[event.data] else { continue }
                    if event.events & (fcm_epoll_hup() | fcm_epoll_err()) != 0 { stream.noteHangUp() }
                    markReady(stream)
                }
            }
            if woken { takeIncoming() }
            let now = ContinuousClock.now
            while let first = timers.first, first.due <= now {
                timers.removeFirst()
                if let stream = streams[first.id], stream.timerGeneration == first.generation {
                    stream.timerFired()
                    markReady(stream)
                }
            }
            let turning = ready
            ready.removeAll(keepingCapacity: true)
            for stream in turning {
                stream.isQueuedToTurn = false
                stream.turnOnEventLoop(self)
            }
        }
    }

    private func takeIncoming() {
        var drained: UInt64 = 0
        _ = read(wakeFD, &drained, 8)
        wakePending.store(false, ordering: .sequentiallyConsistent)
        let (woken, new) = incoming.withLock { state in
            defer { state = ([], []) }
            return state
        }
        for stream in new {
            let id = nextID
            nextID += 1
            streams[id] = stream
            stream.begin(on: self, id: id)
            markReady(stream)
        }
        for stream in woken {
            stream.releaseWake()
            markReady(stream)
        }
    }

    /// Arms the timerfd for the earliest live deadline (stale entries dropped first).
    private func armTimer() {
        while let first = timers.first, streams[first.id]?.timerGeneration != first.generation { timers.removeFirst() }
        guard let due = timers.first?.due else {
            if armedFor != nil { _ = fcm_timerfd_arm(timerFD, 0) }
            armedFor = nil
            return
        }
        guard armedFor != due else { return }
        let wait = due - .now
        let nanoseconds = max(1, wait.components.seconds * 1_000_000_000 + wait.components.attoseconds / 1_000_000_000)
        _ = fcm_timerfd_arm(timerFD, nanoseconds)
        armedFor = due
    }
}

/// A binary min-heap (the event loop's timers).
struct Heap<Element: Comparable> {
    private var items: [Element] = []

    var first: Element? { items.first }

    mutating func insert(_ item: Element) {
        items.append(item)
        var child = items.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard items[child] < items[parent] else { break }
            items.swapAt(child, parent)
            child = parent
        }
    }

    @discardableResult
    mutating func removeFirst() -> Element? {
        guard !items.isEmpty else { return nil }
        items.swapAt(0, items.count - 1)
        let first = items.removeLast()
        var parent = 0
        while true {
            let left = 2 * parent + 1, right = left + 1
            var smallest = parent
            if left < items.count && items[left] < items[smallest] { smallest = left }
            if right < items.count && items[right] < items[smallest] { smallest = right }
            guard smallest != parent else { break }
            items.swapAt(parent, smallest)
            parent = smallest
        }
        return first
    }
}
