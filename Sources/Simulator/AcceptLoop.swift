import Foundation
import Runtime
import Synchronization
import Transport
#if canImport(Glibc)
import Glibc
#endif

/// A simulator's listening socket and the thread that accepts on it (`start`): every
/// connection accepted goes to the handler, until `stop()`. The thread sleeps in poll(2)
/// until a connection comes or `stop()` wakes it through its `WakePipe`.
final class AcceptLoop: Sendable {
    /// The port it listens on (the one asked for, or the one the system chose for 0).
    let port: Int
    private let fd: Int32
    private let wakePipe: WakePipe
    private let stopping = Atomic(false)
    /// Signalled by the thread once it has closed the socket.
    private let closed = DispatchSemaphore(value: 0)

    /// Listens, non-blocking, on `host:port` (0: a free port); accepts nothing before `start`.
    init(host: String, port: Int) throws {
        do { wakePipe = try WakePipe() } catch { throw SimulatorError("\(error)") }
        do {
            let listener = try TCPListener.open(host: host, port: port, nonBlocking: true)
            (fd, self.port) = (listener.fd, listener.port)
        } catch {
            throw SimulatorError("\(error)")
        }
    }

    /// Accepts on a thread named `name`, handing each connection's descriptor to `accept`
    /// (which must not block: it starts what serves the connection).
    func start(name: String, accept: @escaping @Sendable (Int32) -> Void) {
        let thread = Thread { [self] in run(accept) }
        thread.name = name
        thread.start()
    }

    /// Stops accepting. The first call returns once the socket is closed (within 5 s), so
    /// the port is free then: a simulator started on it next (a server that came back) can
    /// listen there.
    func stop() {
        guard !stopping.exchange(true, ordering: .acquiringAndReleasing) else { return }
        wakePipe.wake()
        _ = closed.wait(timeout: .now() + 5)
    }

    private func run(_ accept: (Int32) -> Void) {
        defer {
            close(fd)
            closed.signal()
        }
        while !stopping.load(ordering: .acquiring) {
            var descriptors = [pollfd(fd: fd, events: Int16(POLLIN), revents: 0), wakePipe.pollDescriptor]
            guard poll(&descriptors, 2, -1) >= 0 || errno == EINTR else { return }
            while !stopping.load(ordering: .acquiring) {
                let connection = Glibc.accept(fd, nil, nil)
                if connection < 0 { break }
                accept(connection)
            }
        }
    }
}
