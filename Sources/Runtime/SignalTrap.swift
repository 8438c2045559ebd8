import Dispatch
import Foundation

/// Runs `handler` on SIGTERM or SIGINT instead of letting them kill the process; keep the
/// trap alive as long as the handler should run.
public final class SignalTrap {
    private let sources: [any DispatchSourceSignal]

    public init(_ handler: @escaping @Sendable (Int32) -> Void) {
        signal(SIGTERM, SIG_IGN)
        signal(SIGINT, SIG_IGN)
        sources = [SIGTERM, SIGINT].map { number in
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler { handler(number) }
            source.resume()
            return source
        }
    }
}
