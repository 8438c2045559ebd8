import FCM
import Foundation
import Runtime
import Simulator
import Worker
import XMPP

/// The `--upstream N --upstream-rate R` load of `simulate`: starts at the first bound session.
///
/// The messages are made before the first session binds, so that making them does not
/// take CPU from the worker the run measures (the simulator shares its cores).
final class LoadScript: Sendable {
    private let count: Int
    private let rate: Int
    private let records: [CCSSimulator.UpstreamRecord]
    /// The simulator once attached, and whether the load has started.
    private let state = BlockingLock<(simulator: CCSSimulator?, started: Bool)>((nil, false))

    init(count: Int, rate: Int) {
        self.count = count
        self.rate = rate
        self.records = (0..<count).map(Self.record)
    }

    func attach(_ simulator: CCSSimulator) {
        state.withLock { $0.simulator = simulator }
    }

    func observe(_ event: SimulatorEvent) {
        guard case .bound = event else { return }
        let simulator = state.withLock { state -> CCSSimulator? in
            defer { state.started = true }
            return state.started ? nil : state.simulator
        }
        guard let simulator, count > 0 else { return }
        let count = self.count, rate = self.rate, records = self.records
        Task {
            let begin = ContinuousClock.now
            var injected = 0
            while injected < count {
                let target: Int
                if rate == 0 {
                    // As fast as flow control lets them through, with a bounded backlog.
                    target = min(count, simulator.counters.upstreamDelivered + 20_000)
                } else {
                    target = min(count, Int(Double(rate) * (ContinuousClock.now - begin).seconds) + 1)
                }
                if target > injected {
                    simulator.injectUpstream(records[injected..<target])
                    injected = target
                }
                // Pacing (a rate), or the simulator's deliveries catching up with the backlog:
                // checked each millisecond; a cancelled wait ends the load.
                guard (try? await Task.sleep(for: .milliseconds(1))) != nil else { return }
            }
        }
    }
}

extension LoadScript {
    /// Message `number` of the load: 1,000 devices in turn, the same small `data` each.
    static func record(_ number: Int) -> CCSSimulator.UpstreamRecord {
        let messageID = "load-\(number)", from = "device-\(number % 1000)"
        let json = "{\"category\":\"com.example.bench\",\"data\":{\"n\":\"\(number)\",\"text\":\"benchmark payload\"},"
            + "\"from\":\"\(from)\",\"message_id\":\"\(messageID)\"}"
        return CCSSimulator.UpstreamRecord(messageID: messageID, from: from, json: json)
    }
}
