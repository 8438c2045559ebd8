import FCM
import Foundation
import Runtime
import Simulator
import Worker
import XMPP

/// The `--upstream` and `--drop-after` behaviour of `simulate`.
final class DemoScript: Sendable {
    private let upstreamCount: Int
    private let interval: Duration
    private let dropAfter: Duration?
    private struct State {
        var simulator: CCSSimulator?
        var started = false
        var dropped = false
    }
    private let state = BlockingLock(State())

    init(upstreamCount: Int, interval: Duration, dropAfter: Duration?) {
        self.upstreamCount = upstreamCount
        self.interval = interval
        self.dropAfter = dropAfter
    }

    func attach(_ simulator: CCSSimulator) {
        state.withLock { $0.simulator = simulator }
    }

    func observe(_ event: SimulatorEvent) {
        guard case .bound(let session, _) = event else { return }
        let (upstreamCount, dropAfter) = (self.upstreamCount, self.dropAfter)
        let (simulator, startUpstream, scheduleDrop) = state.withLock { state -> (CCSSimulator?, Bool, Bool) in
            defer { state.started = true; state.dropped = state.dropped || dropAfter != nil }
            return (state.simulator, !state.started && upstreamCount > 0, !state.dropped && dropAfter != nil)
        }
        guard let simulator else { return }
        let count = upstreamCount, interval = self.interval
        if startUpstream {
            Task {
                // Paced by time; a cancelled wait ends the script.
                for number in 1...count {
                    simulator.injectUpstream(from: "demo-device-\(number % 3 + 1)", category: "com.example.demo",
                                             data: ["text": .string("hello \(number)"), "action": .string("demo")])
                    guard (try? await Task.sleep(for: interval)) != nil else { return }
                }
            }
        }
        if scheduleDrop, let dropAfter {
            Task {
                guard (try? await Task.sleep(for: dropAfter)) != nil else { return }
                simulator.drop(session: session)
            }
        }
    }
}

extension SimulatorEvent {
    /// True for the events every message causes (left out of a `--quiet` log).
    var isPerMessage: Bool {
        switch self {
        case .upstreamDelivered, .upstreamAcked, .downstreamReceived, .downstreamAnswered, .receiptSent, .pingAnswered: true
        default: false
        }
    }
}
