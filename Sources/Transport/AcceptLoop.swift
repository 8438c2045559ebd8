import Foundation
import Runtime
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A listening socket and the thread that accepts on it (`start`): every connection
/// accepted goes to the handler, until `stop()`. The thread sleeps in poll(2) until a
/// connection comes or `stop()` wakes it through its `WakePipe`. The simulators' servers
/// and the worker's `HTTPServer` (metrics, ingress) accept through it.
package final class AcceptLoop: Sendable {
    /// The port it listens on (the one asked for, or the one the system chose for 0).
    package let port: Int
    private let fd: Int32
    private let wakePipe: WakePipe
    private let stopping = Atomic(false)
    /// Set and signalled by the thread once it has closed the socket.
    private let isClosed = Atomic(false)
    private let closing = ThreadCondition()
    /// A descriptor held in reserve (`/dev/null`): out of descriptors, it is given up for a
    /// moment to accept the waiting connection and close it at once, so that its client sees
    /// a refusal rather than waiting in the backlog, then taken again.
    private let spare = BlockingLock<Int32>(-1)

    /// Listens, non-blocking, on `host:port` (0: a free port); accepts nothing before `start`.
    /// - Throws: `TransportError.connectFailed` saying why the address cannot be listened on.
    package init(host: String, port: Int) throws(TransportError) {
        do { wakePipe = try WakePipe() } catch { throw .connectFailed(host: host, port: port, reason: "\(error)") }
        spare.withLock { $0 = open("/dev/null", O_RDONLY | O_CLOEXEC) }
        do {
            let listener = try TCPListener.open(host: host, port: port, nonBlocking: true)
            (fd, self.port) = (listener.fd, listener.port)
        } catch {
            throw .connectFailed(host: host, port: port, reason: error.description)
        }
    }

    /// Accepts on a thread named `name`, handing each connection's descriptor to `accept`
    /// (which must not block: it starts what serves the connection).
    ///
    /// When accepting fails for want of a resource (the process or the system out of
    /// descriptors, the kernel out of memory), `failed` is told why and the loop stops
    /// accepting for a while (100 ms, doubling to 1 s while it keeps failing) instead of
    /// spinning on a socket that stays readable; waiting clients stay in the listen backlog.
    package func start(name: String, accept: @escaping @Sendable (Int32) -> Void,
                       failed: @escaping @Sendable (_ reason: String) -> Void = { _ in }) {
        Thread.start(named: name) { [self] in run(accept, failed: failed) }
    }

    /// Stops accepting. The first call returns once the socket is closed (within 5 s), so
    /// the port is free then: a simulator started on it next (a server that came back) can
    /// listen there.
    package func stop() {
        guard !stopping.exchange(true, ordering: .acquiringAndReleasing) else { return }
        wakePipe.wake()
        let limit = ContinuousClock.now + .seconds(5)
        closing.withLock {
            while !isClosed.load(ordering: .acquiring), closing.wait(until: limit) {}
        }
    }

    /// Out of descriptors: the spare one is closed, the next waiting connection accepted and
    /// closed (its client sees the refusal), and the spare taken again.
    private func refuseOneWithTheSpare() {
        spare.withLock { spare in
            guard spare >= 0 else { return }
            close(spare)
            let refused = Glibc.accept(fd, nil, nil)
            if refused >= 0 { close(refused) }
            spare = open("/dev/null", O_RDONLY | O_CLOEXEC)
        }
    }

    private func run(_ accept: (Int32) -> Void, failed: (String) -> Void) {
        defer {
            close(fd)
            spare.withLock { if $0 >= 0 { close($0) } }
            isClosed.store(true, ordering: .releasing)
            closing.wake()
        }
        var pause: Int32 = 0
        while !stopping.load(ordering: .acquiring) {
            // While pausing, only the wake pipe is watched (the listening socket stays readable).
            var descriptors = [pollfd(fd: pause > 0 ? -1 : fd, events: Int16(POLLIN), revents: 0), wakePipe.pollDescriptor]
            guard poll(&descriptors, 2, pause > 0 ? pause : -1) >= 0 || errno == EINTR else { return }
            if pause > 0 && descriptors[1].revents == 0 {
                // The pause is over: try again (and pause longer if it still fails).
                pause = -pause
                continue
            }
            while !stopping.load(ordering: .acquiring) {
                let connection = Glibc.accept(fd, nil, nil)
                if connection >= 0 {
                    pause = 0
                    accept(connection)
                    continue
                }
                let error = errno
                if error == EMFILE || error == ENFILE || error == ENOBUFS || error == ENOMEM {
                    pause = pause < 0 ? min(-pause * 2, 1000) : 100
                    refuseOneWithTheSpare()
                    failed(String(cString: strerror(error)))
                } else if pause < 0 {
                    pause = 0
                }
                break
            }
        }
    }
}
