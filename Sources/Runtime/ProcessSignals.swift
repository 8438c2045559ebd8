#if canImport(Glibc)
import Glibc
#endif

/// Ignores SIGPIPE once for the whole process: a write to a closed socket must return EPIPE,
/// not kill the worker.
public enum ProcessSignals {
    private static let ignoreSIGPIPEOnce: Void = { _ = signal(SIGPIPE, SIG_IGN) }()

    /// Sets SIGPIPE to ignored (idempotent).
    public static func ignoreSIGPIPE() { _ = ignoreSIGPIPEOnce }
}
