import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The scheduling priority of the calling thread (Linux keeps a nice value per thread).
///
/// Stream threads raise theirs so that reading a stanza and writing its ack do not queue
/// behind database and handler work when the cores are busy: on a loaded 2-core machine
/// that queueing, not the work itself, is most of an ack's latency. Lowering a nice value
/// needs root or `CAP_SYS_NICE`; without it the thread keeps its priority and the refusal
/// is counted, so the caller can say so once.
package enum ThreadPriority {
    private static let refusals = Atomic(0)
    private static let refusalReported = Atomic(false)

    /// Sets the calling thread's nice value (-20 most favoured … 19 least); false when the
    /// system refused.
    @discardableResult
    package static func setCurrentThread(niceness: Int32) -> Bool {
        // With `who` 0, PRIO_PROCESS names the calling thread on Linux, not the process.
        if setpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0, niceness) == 0 { return true }
        refusals.add(1, ordering: .relaxed)
        return false
    }

    /// How many threads could not get the priority they asked for so far.
    package static var refusalCount: Int { refusals.load(ordering: .relaxed) }

    /// True the first time it is called after a refusal, so that the process says so once.
    package static func takeUnreportedRefusal() -> Bool {
        refusalCount > 0 && !refusalReported.exchange(true, ordering: .relaxed)
    }
}
