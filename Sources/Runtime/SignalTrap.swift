import Dispatch
import Foundation

/// Runs `handler` on SIGTERM or SIGINT (or the signals given) instead of letting them kill the process; keep the
/// trap alive as long as the handler should run.
public final class SignalTrap {
    private let sources: [any DispatchSourceSignal]

    /// Traps `signals` (SIGTERM and SIGINT by default).
    public init(_ signals: [Int32] = [SIGTERM, SIGINT], _ handler: @escaping @Sendable (Int32) -> Void) {
        for number in signals { signal(number, SIG_IGN) }
        sources = signals.map { number in
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler { handler(number) }
            source.resume()
            return source
        }
    }
}
