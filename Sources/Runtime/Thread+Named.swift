import Foundation

extension Thread {
    /// Starts an OS thread named `name` that runs `body` and ends when it returns: the
    /// project's one way to make a thread (the loops of TLS streams and accept sockets, the
    /// threads that run blocking C calls, the deadline thread, a PostgreSQL cancel request).
    /// The name shows in `top -H`, `perf` and core dumps (Linux keeps its first 15 bytes).
    /// A thread that sleeps waits on a `ThreadCondition` or, in poll(2), on a `WakePipe`.
    package static func start(named name: String, stackSize: Int = 1 << 20, _ body: @escaping @Sendable () -> Void) {
        let thread = Thread(block: body)
        thread.name = name
        thread.stackSize = stackSize
        thread.start()
    }
}
