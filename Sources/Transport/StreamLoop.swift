internal import CSystem
import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif
import Runtime

/// Protocol logic that runs on a stream's thread and tells its `StreamLoop` what to do.
/// Every method is called on that thread only.
package protocol StreamDriver: AnyObject {
    /// The TLS handshake finished; the stream may start.
    func streamDidOpen(_ loop: StreamLoop)
    /// Bytes arrived from the peer (valid only during the call).
    func stream(_ loop: StreamLoop, didRead bytes: UnsafeRawBufferPointer)
    /// Called on every turn of the loop (after a wakeup, I/O, or a deadline passing).
    func streamDidWake(_ loop: StreamLoop)
    /// Whether the loop should read from the socket now (false applies backpressure).
    var wantsToRead: Bool { get }
    /// The next time `streamDidWake` must run even if nothing happens.
    func nextDeadline(_ loop: StreamLoop) -> ContinuousClock.Instant?
    /// True when the driver has work of its own to do on the next turn without waiting for
    /// the socket (requests already read that waited for the output to drain): the loop
    /// then turns again at once. Asked once a turn, before the loop sleeps.
    var wantsAnotherTurn: Bool { get }
    /// The stream ended and the socket is closed; called exactly once. `reason` is a
    /// `TransportError` or what was passed to `close`/`abort`/`requestClose`.
    func streamDidEnd(_ loop: StreamLoop, reason: any Error)
}

extension StreamDriver {
    package var wantsAnotherTurn: Bool { false }
}

/// Wakes a stream from `OutboundBuffer`'s producers: through its wake pipe, or its event loop.
/// `@unchecked Sendable`: `stream` is set once, before the stream starts (which publishes it).
private final class OutboundWaker: @unchecked Sendable {
    let pipe: WakePipe?
    weak var stream: StreamLoop?

    init(pipe: WakePipe?) { self.pipe = pipe }

    func wake() {
        if let pipe { pipe.wake() } else { stream?.wake() }
    }
}

/// One TLS stream's thread: it owns the socket and the `SSL*`, and runs a poll(2) loop
/// that writes queued bytes (coalesced into large TLS writes), reads what arrives and
/// hands it to its driver (the XMPP layer parses it).
///
/// Other threads and tasks talk to it only through `outbound` (bounded, async),
/// `wake()` and `requestClose(_:)`. `@unchecked Sendable`: everything else (the socket, the
/// `SSL*`, the buffers) is touched only on its thread.
package final class StreamLoop: @unchecked Sendable {
    /// Where the socket comes from.
    package enum Origin: Sendable {
        case connect(host: String, port: Int, timeout: Duration)
        case accepted(fd: Int32)
    }

    /// How another thread asks the stream to end.
    package enum CloseRequest: Sendable {
        /// Send `</stream:stream>` and close_notify after what is queued, then close.
        case graceful(any Error)
        /// Close the socket at once, sending nothing more.
        case abort(any Error)
    }

    /// A graceful close under way: why, when it gives up waiting for the peer, and whether
    /// the driver was told that everything queued went out. The loop reads it on every turn:
    /// a struct whose layout is known when this is compiled (not a labelled tuple, not a
    /// `ContinuousClock.Instant`), so that it is not inspected through value witnesses
    /// looked up at run time.
    private struct Closing {
        let reason: any Error
        var deadline: ContinuousClock.Instant { storedDeadline.instant }
        var notifySent: Bool
        private let storedDeadline: FixedLayoutInstant

        init(reason: any Error, deadline: ContinuousClock.Instant) {
            self.reason = reason
            self.notifySent = false
            storedDeadline = FixedLayoutInstant(deadline)
        }
    }

    package static let recordSize = 16 * 1024
    /// The largest buffer kept for reuse (`spareBytes`): coalesced chunks stop growing past
    /// 64 KiB, and one large stanza's buffer is not worth holding on to.
    private static let largestSpare = 256 * 1024

    package let outbound: OutboundBuffer
    let name: String
    /// Wakes the loop from other threads (its flag is cleared by the loop before it looks
    /// at its queues, so no wakeup is lost); nil on an event loop, which wakes it instead.
    private let wakePipe: WakePipe?
    /// The event loop it turns on, or nil for a thread of its own.
    private let eventLoop: EventLoop?
    /// On an event loop: its number there, whether its socket is in the loop's epoll set and
    /// with which events, when its timer is set for, and whether a wake from another thread
    /// is on its way (loop thread, but `wakeClaimed`).
    private var eventLoopID: UInt64 = 0
    private var isWatched = false
    private var watchedEvents: UInt32 = 0
    private var scheduledDue: ContinuousClock.Instant?
    /// Bumped whenever the timer is set anew (an entry of an older generation is stale).
    var timerGeneration: UInt64 = 0
    /// Queued for a turn on the loop's next pass.
    var isQueuedToTurn = false
    private let wakeClaimed = Atomic(false)
    /// On an event loop: the TLS handshake is done (on a thread of its own `open()` waits for it).
    private var opened = false
    private var handshakeDeadline: ContinuousClock.Instant = .now
    private let closeRequest = BlockingLock<CloseRequest?>(nil)
    /// The loop's thread (`pthread_self()`), 0 until it runs: a wake from the loop's own
    /// thread needs no byte in the pipe.
    private let loopThread = Atomic<UInt>(0)

    // Thread-confined state below.
    private let origin: Origin
    /// nil: a plain connection (no TLS).
    private let tlsContext: TLSContext?
    private let role: TLSRole
    private let handshakeTimeout: Duration
    private let closingTail: String
    private let niceness: Int32?
    private let driver: any StreamDriver
    private var tls: TLSStream?
    private var pending: [OutboundBuffer.Chunk] = []
    /// The emptied buffer of the last ordinary chunk written out, for the next one that
    /// `write(_:)` starts: a read's acks grew a new one from nothing each time (five
    /// allocations and their copies for a read of fifteen messages).
    private var spareBytes: [UInt8] = []
    private var pendingOffset = 0
    private var pendingBytes = 0
    private var writeWaitsFor: Int16 = 0
    private var readWaitsFor: Int16 = Int16(POLLIN)
    private var closing: Closing?
    private var ended = false
    private var socketHungUp = false
    /// `wake()` was called on the loop's own thread (by the driver, or by what it called)
    /// since the loop last called `streamDidWake`: the loop turns again without sleeping.
    private var wokenFromLoop = false
    /// The last poll found the wake pipe readable (or none has run yet).
    private var wakePipeReadable = true
    /// When bytes last arrived from the peer (whitespace keepalives included).
    package private(set) var lastReadAt: ContinuousClock.Instant = .now
    /// The application protocol ALPN chose in the handshake (loop thread, from
    /// `streamDidOpen` on); nil when none was.
    package private(set) var negotiatedProtocol: String?

    /// - Parameter closingTail: written after what is queued when the stream closes
    ///   gracefully (`</stream:stream>` for XMPP), before the TLS close_notify.
    /// - Parameter tlsContext: nil for a plain connection (a server port behind a
    ///   TLS-terminating load balancer).
    /// - Parameter eventLoop: the loop it turns on (an accepted socket only: a connect would
    ///   block it); nil for a thread of its own.
    /// - Throws: `TransportError.connectionLost` when the process is out of descriptors for
    ///   its wake pipe (the caller closes an accepted socket it was given);
    ///   `.connectFailed` for a connect given an event loop.
    package init(name: String, origin: Origin, tlsContext: TLSContext?, role: TLSRole,
         handshakeTimeout: Duration, closingTail: String = "",
         outboundCapacity: Int, niceness: Int32? = nil, on eventLoop: EventLoop? = nil, driver: any StreamDriver) throws(TransportError) {
        ProcessSignals.ignoreSIGPIPE()
        if eventLoop != nil, case .connect(let host, let port, _) = origin {
            throw .connectFailed(host: host, port: port, reason: "an event loop serves accepted sockets only (a connect would block it)")
        }
        let wakePipe: WakePipe?
        if eventLoop == nil {
            do { wakePipe = try WakePipe() } catch { throw .connectionLost("\(name): \(error)") }
        } else {
            wakePipe = nil
        }
        self.wakePipe = wakePipe
        self.eventLoop = eventLoop
        let waker = OutboundWaker(pipe: wakePipe)
        self.name = name
        self.origin = origin
        self.tlsContext = tlsContext
        self.role = role
        self.handshakeTimeout = handshakeTimeout
        self.closingTail = closingTail
        self.niceness = niceness
        self.driver = driver
        self.outbound = OutboundBuffer(capacity: outboundCapacity) { waker.wake() }
        waker.stream = self
    }

    /// Starts the thread, or (on an event loop) hands the stream to its loop. Either keeps
    /// the stream alive until it ends.
    package func start() {
        if let eventLoop {
            eventLoop.register(self)
        } else {
            Thread.start(named: name) { self.main() }
        }
    }

    /// Makes the loop turn (and call `streamDidWake`) soon. Safe from any thread.
    package func wake() {
        if let eventLoop {
            eventLoop.wake(self)
            return
        }
        if loopThread.load(ordering: .relaxed) == UInt(pthread_self()) {
            // On the loop's thread (a driver's callback queued work for its own loop): the
            // loop turns again before it sleeps, without the pipe's syscalls.
            wokenFromLoop = true
            return
        }
        wakePipe?.wake()
    }

    /// Asks the stream to end. Safe from any thread; the first request wins.
    package func requestClose(_ request: CloseRequest) {
        closeRequest.withLock { if $0 == nil { $0 = request } }
        wake()
    }

    // MARK: - For the driver (loop thread only)

    /// Queues `text` ahead of any backpressure (negotiation, pongs, acks of the stream itself).
    package func write(_ text: String) {
        guard !ended, !text.isEmpty else { return }
        // Straight into the chunk it would be coalesced with (an ack per upstream message
        // comes this way): no array of its own first.
        if let last = pending.indices.last, pending[last].recordSize == Self.recordSize, pending[last].bytes.count < 64 * 1024 {
            pending[last].bytes.append(contentsOf: text.utf8)
            pendingBytes += text.utf8.count
            return
        }
        var bytes: [UInt8] = []
        swap(&bytes, &spareBytes)
        bytes.append(contentsOf: text.utf8)
        appendPending(OutboundBuffer.Chunk(bytes: bytes, recordSize: Self.recordSize))
    }

    /// Queues raw bytes cut into TLS records of at most `recordSize` bytes (the simulator's
    /// byte-at-a-time and malformed-input scripts).
    package func write(bytes: [UInt8], recordSize: Int) {
        appendPending(OutboundBuffer.Chunk(bytes: bytes, recordSize: max(1, min(recordSize, Self.recordSize))))
    }

    /// Closes `outbound`'s gate (gated sends are refused from now on) and moves what it
    /// holds into the pending writes, so that everything queued before this call goes out
    /// ahead of anything written after it.
    package func closeGate() {
        outbound.closeGate()
        for chunk in outbound.takeAll() { appendPending(chunk) }
    }

    /// Ends the stream gracefully: what is queued is sent, then the closing tail and a
    /// TLS close_notify; the socket closes once the peer closes too or a second has passed.
    package func close(reason: any Error) {
        guard closing == nil, !ended else { return }
        // Refuse new sends (waiting senders fail with the reason), then send what was queued.
        outbound.close(with: reason)
        for chunk in outbound.takeAll() { appendPending(chunk) }
        if !closingTail.isEmpty { write(closingTail) }
        closing = Closing(reason: reason, deadline: .now + .seconds(1))
    }

    /// Ends the stream at once: the socket is closed without another byte.
    package func abort(reason: any Error) {
        end(reason)
    }

    package var isEnded: Bool { ended }

    /// Bytes the driver wrote that the socket has not taken yet (a peer that does not read
    /// makes it grow: a server stops reading from it past its bound).
    package var pendingOutputBytes: Int { pendingBytes }

    /// True once a graceful close has begun (what arrives now is not handed to the driver).
    package var isClosing: Bool { closing != nil }

    // MARK: - The loop

    private func main() {
        loopThread.store(UInt(pthread_self()), ordering: .relaxed)
        if let niceness { ThreadPriority.setCurrentThread(niceness: niceness) }
        do {
            try open()
            driver.streamDidOpen(self)
            run()
        } catch {
            end(error)
        }
    }

    private func open() throws {
        let deadline = ContinuousClock.now + handshakeTimeout
        let fd: Int32
        switch origin {
        case .connect(let host, let port, let timeout):
            fd = try TCPConnector.connect(host: host, port: port, deadline: min(deadline, .now + timeout))
        case .accepted(let accepted):
            fd = accepted
            TCPConnector.configure(fd)
        }
        let stream = try TLSStream(fd: fd, context: tlsContext, role: role)
        tls = stream
        while true {
            if let request = closeRequest.withLock({ $0 }) {
                switch request {
                case .graceful(let reason), .abort(let reason): throw reason
                }
            }
            let events: Int16
            switch stream.handshake() {
            case .done:
                negotiatedProtocol = stream.negotiatedProtocol
                return
            case .wantRead: events = Int16(POLLIN)
            case .wantWrite: events = Int16(POLLOUT)
            case .closedByPeer: throw TransportError.tlsFailed("the peer closed the connection during the handshake")
            case .failed(let error): throw error
            }
            if case .timedOut = TCPConnector.waitFor(fd, events: events, until: min(deadline, .now + .milliseconds(200))),
               ContinuousClock.now >= deadline {
                throw TransportError.handshakeTimedOut
            }
        }
    }

    /// What a turn leaves the loop to wait for: the socket's poll events (and whether to
    /// watch the socket at all), the next deadline, and whether to turn again at once.
    private struct Interest {
        var events: Int16
        var watchSocket: Bool
        var deadline: ContinuousClock.Instant?
        var again: Bool
    }

    private func run() {
        let readBuffer = UnsafeMutableRawBufferPointer.allocate(byteCount: Self.recordSize, alignment: 16)
        defer { readBuffer.deallocate() }
        let wakePipe = wakePipe!
        while !ended {
            guard let interest = turn(readBuffer: readBuffer) else { return }
            // ppoll(2) takes the wait to the nanosecond: poll's whole milliseconds would
            // make every timed event (a scripted answer delay, a ping) up to 1 ms late.
            let timeout: timespec?
            if interest.again {
                timeout = timespec(tv_sec: 0, tv_nsec: 0)
            } else if let deadline = interest.deadline {
                timeout = (deadline - .now).timespecWithinADay
            } else {
                timeout = nil
            }
            var descriptors = [
                pollfd(fd: interest.watchSocket ? tls!.fd : -1, events: interest.events, revents: 0),
                wakePipe.pollDescriptor,
            ]
            let result: Int32
            if var timeout {
                result = fcm_ppoll(&descriptors, 2, &timeout)
            } else {
                result = fcm_ppoll(&descriptors, 2, nil)
            }
            if result < 0 && errno != EINTR {
                end(TransportError.connectionLost("poll failed: \(String(cString: strerror(errno)))"))
                return
            }
            if descriptors[1].revents != 0 { wakePipeReadable = true }
            let revents = descriptors[0].revents
            if result > 0 && revents & Int16(POLLNVAL) != 0 {
                end(TransportError.connectionLost("socket became invalid"))
                return
            }
            if revents & Int16(POLLHUP | POLLERR) != 0 { socketHungUp = true }
        }
    }

    /// One turn: close requests, the driver's wake, writes, reads; nil once the stream ended.
    private func turn(readBuffer: UnsafeMutableRawBufferPointer) -> Interest? {
        // The pipe is read only when a waker wrote to it or the last poll saw a byte
        // there: most turns (a read came) then cost no syscall for it.
        if let wakePipe, wakePipeReadable || wakePipe.isPending {
            wakePipeReadable = false
            wakePipe.drain()
        }
        if let request = closeRequest.withLock({ request -> CloseRequest? in
            defer { request = nil }
            return request
        }) {
            switch request {
            case .abort(let reason): end(reason); return nil
            case .graceful(let reason): close(reason: reason)
            }
        }
        wokenFromLoop = false
        driver.streamDidWake(self)
        if ended { return nil }

        if pendingBytes < 256 * 1024 {
            for chunk in outbound.takeAll() { appendPending(chunk) }
        }
        flushWrites()
        if ended { return nil }

        sendCloseNotifyIfDue()
        if let closing, ContinuousClock.now >= closing.deadline {
            end(closing.reason)
            return nil
        }

        let moreToRead = readAvailable(readBuffer)
        if ended { return nil }
        // Answers the driver wrote while handling what was read leave before we sleep, and
        // a close begun meanwhile says so now (not after the sleep: an HTTP/1.1 answer with
        // `Connection: close` would otherwise end its connection a second late).
        if !pending.isEmpty && writeWaitsFor == 0 {
            flushWrites()
            if ended { return nil }
        }
        sendCloseNotifyIfDue()

        var events: Int16 = 0
        if driver.wantsToRead || closing != nil { events |= readWaitsFor }
        events |= writeWaitsFor
        var deadline = driver.nextDeadline(self)
        if let closing { deadline = min(deadline ?? closing.deadline, closing.deadline) }
        // poll(2) reports a hang-up whatever was asked for: while not reading, a socket
        // that hung up would wake the loop forever, so then only the wake is watched
        // (reading resumes through a wakeup, and the read then sees the end).
        let watchSocket = !(socketHungUp && events & Int16(POLLIN) == 0 && writeWaitsFor == 0)
        return Interest(events: events, watchSocket: watchSocket, deadline: deadline,
                        again: moreToRead || wokenFromLoop || driver.wantsAnotherTurn)
    }

    // MARK: - On an event loop (its thread)

    /// The loop took the stream on: its socket is wrapped for TLS, the handshake starts.
    func begin(on loop: EventLoop, id: UInt64) {
        eventLoopID = id
        loopThread.store(UInt(pthread_self()), ordering: .relaxed)
        handshakeDeadline = .now + handshakeTimeout
        guard case .accepted(let fd) = origin else { return }
        TCPConnector.configure(fd)
        do {
            tls = try TLSStream(fd: fd, context: tlsContext, role: role)
        } catch {
            Glibc.close(fd)
            end(error)
        }
    }

    /// A wake from another thread is now on its way (false: one already was).
    func claimWake() -> Bool { !wakeClaimed.exchange(true, ordering: .acquiringAndReleasing) }

    /// The loop took the wake (the next one queues the stream again).
    func releaseWake() { wakeClaimed.store(false, ordering: .releasing) }

    /// The socket hung up or failed (epoll reports it whatever was asked for).
    func noteHangUp() { socketHungUp = true }

    /// Its timer fired.
    func timerFired() { scheduledDue = nil }

    /// A turn on the loop: the handshake until it is done, then as on a thread of its own;
    /// what it waits for next goes to the loop's epoll set and timers.
    func turnOnEventLoop(_ loop: EventLoop) {
        guard !ended, let tls else { return }
        if !opened {
            guard let waitsFor = stepHandshake(tls) else { return }
            if !opened {
                apply(Interest(events: waitsFor, watchSocket: true, deadline: handshakeDeadline, again: false), on: loop, fd: tls.fd)
                return
            }
        }
        guard let interest = turn(readBuffer: loop.readBuffer), !ended else { return }
        apply(interest, on: loop, fd: tls.fd)
    }

    /// Moves the handshake on: the poll events it waits for (opened once done), or nil
    /// once the stream ended (refused, failed, too slow, or asked to close).
    private func stepHandshake(_ stream: TLSStream) -> Int16? {
        if let request = closeRequest.withLock({ $0 }) {
            switch request {
            case .graceful(let reason), .abort(let reason): end(reason)
            }
            return nil
        }
        let step = stream.handshake()
        switch step {
        case .done:
            opened = true
            negotiatedProtocol = stream.negotiatedProtocol
            driver.streamDidOpen(self)
            return ended ? nil : 0
        case .wantRead, .wantWrite:
            guard ContinuousClock.now < handshakeDeadline else {
                end(TransportError.handshakeTimedOut)
                return nil
            }
            if case .wantRead = step { return Int16(POLLIN) }
            return Int16(POLLOUT)
        case .closedByPeer:
            end(TransportError.tlsFailed("the peer closed the connection during the handshake"))
            return nil
        case .failed(let error):
            end(error)
            return nil
        }
    }

    private func apply(_ interest: Interest, on loop: EventLoop, fd: Int32) {
        var events: UInt32 = 0
        if interest.watchSocket {
            if interest.events & Int16(POLLIN) != 0 { events |= fcm_epoll_in() }
            if interest.events & Int16(POLLOUT) != 0 { events |= fcm_epoll_out() }
            // Watched for its hang-up and errors only (epoll reports those whatever is asked).
            if events == 0 { events = fcm_epoll_err() }
        }
        if events != watchedEvents || !isWatched {
            loop.watch(fd, id: eventLoopID, events: events, registered: &isWatched)
            watchedEvents = events
        }
        if interest.again { loop.markReady(self) }
        // A later deadline leaves the earlier timer: it fires, the stream turns and sets it
        // again (one live timer per stream, however often its deadline moves).
        if let deadline = interest.deadline, scheduledDue.map({ deadline < $0 }) ?? true {
            timerGeneration &+= 1
            scheduledDue = deadline
            loop.schedule(id: eventLoopID, at: deadline, generation: timerGeneration)
        }
    }

    /// Once a graceful close has sent everything queued: close_notify (and, serving, the TCP
    /// FIN after it, so that a client reading to the end sees the end now).
    private func sendCloseNotifyIfDue() {
        guard let closing, closing.notifySent == false, pendingBytes == 0 else { return }
        if case .server = role { tls?.sendCloseNotify(halfClose: true) } else { tls?.sendCloseNotify() }
        self.closing?.notifySent = true
    }

    /// Reads and parses until the socket has nothing more, the driver wants no more, or a
    /// turn's budget is spent; returns true when data may still be waiting.
    private func readAvailable(_ buffer: UnsafeMutableRawBufferPointer) -> Bool {
        guard let tls else { return false }
        // On an event loop a turn reads less at once: the loop's other streams wait meanwhile.
        for _ in 0..<(eventLoop == nil ? 64 : 16) {
            guard !ended, driver.wantsToRead || closing != nil else { return false }
            let progress = tls.read(into: buffer)
            switch progress {
            case .done(let count):
                lastReadAt = .now
                readWaitsFor = Int16(POLLIN)
                // While closing, what arrives is read (to see the peer's close) but not handled.
                if closing == nil {
                    driver.stream(self, didRead: UnsafeRawBufferPointer(rebasing: buffer[..<count]))
                }
            case .wantRead:
                readWaitsFor = Int16(POLLIN)
                return false
            case .wantWrite:
                readWaitsFor = Int16(POLLOUT)
                return false
            case .closedByPeer:
                end(closing?.reason ?? TransportError.closedByPeer)
                return false
            case .failed(let error):
                end(closing?.reason ?? error)
                return false
            }
        }
        return true
    }

    private func appendPending(_ chunk: OutboundBuffer.Chunk) {
        guard !ended, !chunk.bytes.isEmpty else { return }
        pendingBytes += chunk.bytes.count
        // Coalesce ordinary chunks so that many small stanzas leave in few TLS writes.
        if chunk.recordSize == Self.recordSize, let last = pending.indices.last,
           pending[last].recordSize == Self.recordSize, pending[last].bytes.count < 64 * 1024 {
            pending[last].bytes.append(contentsOf: chunk.bytes)
        } else {
            pending.append(chunk)
        }
    }

    private func flushWrites() {
        guard let tls else { return }
        writeWaitsFor = 0
        while !pending.isEmpty {
            // Read in place, not copied out: a chunk written out whole gives its buffer back
            // (`spareBytes`) only if nothing else holds it.
            let recordSize = pending[0].recordSize
            let length = min(pending[0].bytes.count - pendingOffset, recordSize == Self.recordSize ? pending[0].bytes.count : recordSize)
            let progress = pending[0].bytes.withUnsafeBytes { bytes in
                tls.write(UnsafeRawBufferPointer(rebasing: bytes[pendingOffset..<(pendingOffset + length)]))
            }
            switch progress {
            case .done(let written):
                pendingOffset += written
                pendingBytes -= written
                if pendingOffset == pending[0].bytes.count {
                    var done = pending.removeFirst()
                    pendingOffset = 0
                    if recordSize == Self.recordSize && done.bytes.capacity > spareBytes.capacity
                        && done.bytes.capacity <= Self.largestSpare {
                        done.bytes.removeAll(keepingCapacity: true)
                        spareBytes = done.bytes
                    }
                }
            case .wantWrite:
                writeWaitsFor = Int16(POLLOUT)
                return
            case .wantRead:
                writeWaitsFor = Int16(POLLIN)
                return
            case .closedByPeer:
                end(closing?.reason ?? TransportError.closedByPeer)
                return
            case .failed(let error):
                end(closing?.reason ?? error)
                return
            }
        }
    }

    private func end(_ reason: any Error) {
        guard !ended else { return }
        ended = true
        if let eventLoop {
            if isWatched, let fd = tls?.fd { eventLoop.watch(fd, id: eventLoopID, events: 0, registered: &isWatched) }
            eventLoop.unregister(id: eventLoopID)
        }
        tls = nil
        pending.removeAll()
        spareBytes = []
        pendingBytes = 0
        outbound.close(with: reason)
        _ = outbound.takeAll()
        driver.streamDidEnd(self, reason: reason)
    }
}
