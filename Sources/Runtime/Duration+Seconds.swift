#if canImport(Glibc)
import Glibc
#endif

extension Duration {
    /// The duration in seconds, as a floating-point number.
    public var seconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }

    /// "1.5 s" style rendering for log lines.
    public var formattedSeconds: String {
        if seconds < 1 { return "\(Int((seconds * 1000).rounded())) ms" }
        return "\((seconds * 10).rounded() / 10) s"
    }

    /// The duration as a `timespec` for a timed wait (`ppoll`, `pthread_cond_timedwait`): no
    /// less than zero, and no more than a day (a longer wait wakes once a day and waits again).
    package var timespecWithinADay: timespec {
        let (seconds, attoseconds) = max(self, .zero).components
        guard seconds < 86_400 else { return timespec(tv_sec: 86_400, tv_nsec: 0) }
        return timespec(tv_sec: Int(seconds), tv_nsec: Int(attoseconds / 1_000_000_000))
    }
}
