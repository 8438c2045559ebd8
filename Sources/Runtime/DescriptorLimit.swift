#if canImport(Glibc)
import Glibc
#endif

/// The process's limit on open file descriptors (`RLIMIT_NOFILE`). A server that holds a
/// connection per device needs many: the soft limit (1024 under most shells and systemd)
/// is raised to the hard one, as Go's runtime and nginx's `worker_rlimit_nofile` do.
package enum DescriptorLimit {
    /// Raises the soft limit to the hard one; returns the soft limit before and after (the
    /// same when it was already there or the raise was refused).
    @discardableResult
    package static func raiseToHard() -> (before: Int, after: Int) {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return (0, 0) }
        let before = count(limit.rlim_cur)
        guard limit.rlim_cur < limit.rlim_max else { return (before, before) }
        limit.rlim_cur = limit.rlim_max
        guard setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return (before, before) }
        return (before, count(limit.rlim_cur))
    }

    private static func count(_ value: rlim_t) -> Int {
        // RLIM_INFINITY is all ones (its C macro does not import as a number).
        value > rlim_t(Int.max) ? Int.max : Int(value)
    }
}
