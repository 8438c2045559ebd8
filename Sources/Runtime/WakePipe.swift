#if canImport(Glibc)
import Glibc
#endif
import Synchronization

/// How a thread that sleeps in poll(2) is woken from other threads: a pipe whose read end
/// the thread polls beside its own descriptors. Every loop of that kind (a TLS stream's, a
/// PostgreSQL connection's, an accept loop, the metrics server's) wakes through one.
///
/// Any number of `wake()` calls between two of the loop's turns write one byte: a flag says
/// a byte is on its way, and the loop clears it when it drains the pipe. The pipe's ends
/// are non-blocking, not inherited by child processes, and closed when this is freed.
package final class WakePipe: Sendable {
    /// The end the loop polls (`pollDescriptor`).
    package let readEnd: Int32
    private let writeEnd: Int32
    /// A waker claimed the byte since the last `drain()`.
    private let pending = Atomic(false)

    /// The pipe could not be made (the process is out of descriptors, most likely).
    package struct Unavailable: Error, CustomStringConvertible {
        package let reason: String
        package var description: String { "cannot make a wake pipe: \(reason)" }
    }

    package init() throws(Unavailable) {
        var ends: [Int32] = [0, 0]
        guard pipe(&ends) == 0 else { throw Unavailable(reason: String(cString: strerror(errno))) }
        for end in ends {
            _ = fcntl(end, F_SETFL, fcntl(end, F_GETFL) | O_NONBLOCK)
            _ = fcntl(end, F_SETFD, FD_CLOEXEC)
        }
        (readEnd, writeEnd) = (ends[0], ends[1])
    }

    deinit {
        close(readEnd)
        close(writeEnd)
    }

    /// What the loop passes to poll(2) for the pipe.
    package var pollDescriptor: pollfd { pollfd(fd: readEnd, events: Int16(POLLIN), revents: 0) }

    /// Makes the loop's poll return (the one under way, or the next). Safe from any thread;
    /// a syscall only when no wake is pending already.
    package func wake() {
        guard !pending.exchange(true, ordering: .acquiringAndReleasing) else { return }
        var byte: UInt8 = 1
        _ = write(writeEnd, &byte, 1)
    }

    /// True when a wake came since the last `drain()` (its byte is in the pipe, or on its way).
    package var isPending: Bool { pending.load(ordering: .acquiring) }

    /// Empties the pipe, then lets the next wake write again (the loop's thread, before it
    /// looks at what it was woken for). In this order a wake that races with the drain either
    /// leaves its byte for the next poll or finds the flag still set, and its work was queued
    /// before it tried, so the loop's turn after the drain sees it.
    package func drain() {
        var scratch = (UInt64(0), UInt64(0), UInt64(0), UInt64(0))
        while withUnsafeMutableBytes(of: &scratch, { read(readEnd, $0.baseAddress, $0.count) }) > 0 {}
        pending.store(false, ordering: .sequentiallyConsistent)
    }
}
