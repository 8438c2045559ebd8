#if canImport(Glibc)
import Glibc
#endif

/// Ignores SIGPIPE once for the whole process: a write to a closed socket must return EPIPE,
/// not kill the worker.
public enum ProcessSignals {
    private static let ignoreSIGPIPEOnce: Void = { _ = signal(SIGPIPE, SIG_IGN) }()

    /// Sets SIGPIPE to ignored (idempotent).
    public static func ignoreSIGPIPE() { _ = ignoreSIGPIPEOnce }

    /// Sets SIGHUP to ignored: a closed terminal or a supervisor's reload signal must not
    /// kill the worker. Logs go to standard error, which the supervisor owns, so there is no
    /// log file to reopen; configuration is read once at start (restart to change it).
    public static func ignoreSIGHUP() { _ = signal(SIGHUP, SIG_IGN) }
}
