import Runtime

/// Acked messages a shutdown could keep neither in the database nor in the spool (its disk
/// full or gone): `FCMWorker.run()` throws it after the shutdown, so that the process
/// exits non-zero (status 1, the count in its last line) and its supervisor and alerts see
/// a loss, not a clean stop. Their ids are in the log line before it.
public struct ShutdownLoss: Error, CustomStringConvertible, Sendable {
    /// How many acked messages are lost.
    public let count: Int
    /// Why they could not be kept.
    public let reason: String

    public var description: String {
        "the shutdown lost \(count) acked message(s): \(reason) (their ids are in the log line before this one)"
    }
}

/// What the shutdown's parts report lost, for `FCMWorker.run()` to throw once they stopped.
package final class ShutdownLosses: Sendable {
    private let state = BlockingLock<(count: Int, reasons: [String])>((0, []))

    package init() {}

    func record(_ count: Int, reason: String) {
        guard count > 0 else { return }
        state.withLock { state in
            state.count += count
            state.reasons.append(reason)
        }
    }

    /// The loss so far, if any.
    package var loss: ShutdownLoss? {
        state.withLock { state in
            state.count > 0 ? ShutdownLoss(count: state.count, reason: state.reasons.joined(separator: "; ")) : nil
        }
    }
}
