import FCM
import Foundation
import Ingress
import Runtime
import Synchronization
import Transport

/// Simulated devices posting upstream messages to an HTTPS ingress over HTTP/2, each with a
/// Firebase ID token the simulator minted for it (`FirebaseTokenIssuer`): `messages` in all
/// from `devices` devices, at `rate` a second (0: as fast as the answers come, `inFlight` at
/// once), a share of them posted twice (a retry after a lost answer) and a share with a bad
/// token (expired). What the benchmarks and the demo drive an ingress with.
public struct IngressDevices: Sendable {
    public struct Settings: Sendable {
        public var host = "127.0.0.1"
        public var port: Int
        public var trust: TLSTrust
        public var messages = 1000
        public var devices = 100
        /// Messages a second across the devices; 0: as fast as answers come.
        public var rate = 0
        /// Requests in flight at once.
        public var inFlight = 256
        public var connections = 8
        /// Shares (0 to 1) of posts that repeat an earlier message, and that carry an expired token.
        public var duplicateShare = 0.0
        public var badTokenShare = 0.0

        public init(port: Int, trust: TLSTrust) {
            self.port = port
            self.trust = trust
        }
    }

    /// What the devices saw.
    public struct Report: Sendable {
        public var posted = 0
        /// Answers by HTTP status (0: no answer: the connection failed).
        public var statuses: [Int: Int] = [:]
        /// `status` of the 200 answers: accepted, duplicate.
        public var outcomes: [String: Int] = [:]
        /// Microseconds from each post to its answer.
        public var latencies: [UInt32] = []
        public var seconds = 0.0

        public var summary: String {
            let statusText = statuses.sorted { $0.key < $1.key }.map { "\($0.key == 0 ? "no answer" : String($0.key))=\($0.value)" }.joined(separator: " ")
            let outcomeText = outcomes.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
            return "posted \(posted) in \(String(format: "%.2f", seconds)) s: \(statusText) (\(outcomeText))"
        }
    }

    public let settings: Settings
    private let issuer: FirebaseTokenIssuer

    public init(settings: Settings, issuer: FirebaseTokenIssuer) {
        self.settings = settings
        self.issuer = issuer
    }

    /// Waits (up to `limit`) until the ingress accepts connections, then posts everything
    /// and returns what the devices saw.
    public func run(waitingUpTo limit: Duration = .seconds(60)) async throws -> Report {
        let client = try HTTP2Client(host: settings.host, port: settings.port, trust: settings.trust, maximumConnections: settings.connections,
                                     timeout: .seconds(60))
        let tokens = try (0..<settings.devices).map { try issuer.idToken(uid: "simulated-device-\($0)") }
        var expired = issuer.idTokenClaims(uid: "simulated-device-expired", issuedAt: Date() - 7200)
        expired["exp"] = .number(JSONNumber(Int(Date().timeIntervalSince1970) - 3600))
        let badToken = try issuer.sign(expired, kind: .idToken)
        // The ingress may still be starting.
        let deadline = ContinuousClock.now + limit
        while true {
            let probe = try? await client.send(method: "POST", path: "/v1/messages", headers: ["content-type": "application/json"], body: [])
            if probe != nil { break }
            guard ContinuousClock.now < deadline else { throw SimulatorError("the ingress at \(settings.host):\(settings.port) did not answer within \(limit)") }
            try await Task.sleep(for: .milliseconds(50))
        }
        let settings = self.settings
        let report = BlockingLock(Report())
        let next = BlockingLock(0)
        let started = ContinuousClock.now
        var generator = SystemRandomGenerator()
        // Decided up front, so that the run is the same whatever the answers' order.
        let plan: [(device: Int, message: Int, bad: Bool)] = (0..<settings.messages).map { index in
            let device = index % settings.devices
            let repeatOf = index >= settings.devices && Double.random(in: 0..<1, using: &generator) < settings.duplicateShare
            let bad = Double.random(in: 0..<1, using: &generator) < settings.badTokenShare
            return (device, repeatOf ? index - settings.devices : index, bad)
        }
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<min(settings.inFlight, max(1, settings.messages)) {
                group.addTask {
                    // Until every message is posted, or the run is cancelled.
                    while !Task.isCancelled {
                        let index = next.withLock { value -> Int in
                            defer { value += 1 }
                            return value
                        }
                        guard index < plan.count else { return }
                        if settings.rate > 0 {
                            let due = started + .seconds(Double(index) / Double(settings.rate))
                            if due > .now { try? await Task.sleep(until: due, clock: .continuous) }
                        }
                        let (device, message, bad) = plan[index]
                        let body = #"{"message_id":"sim-\#(message)","token":"simulated-token-\#(device)","category":"com.example.simulated","data":{"n":"\#(message)"}}"#
                        let sent = ContinuousClock.now
                        let answer = try? await client.send(method: "POST", path: "/v1/messages",
                                                            headers: ["content-type": "application/json",
                                                                      "authorization": "Bearer " + (bad ? badToken : tokens[device])],
                                                            body: Array(body.utf8))
                        let micros = UInt32(clamping: Int((ContinuousClock.now - sent).seconds * 1_000_000))
                        let outcome = answer.flatMap { $0.status == 200 ? (try? JSONValue.parse($0.body))?["status"]?.stringValue : nil }
                        report.withLock { report in
                            report.posted += 1
                            report.statuses[answer?.status ?? 0, default: 0] += 1
                            if let outcome { report.outcomes[outcome, default: 0] += 1 }
                            report.latencies.append(micros)
                        }
                    }
                }
            }
        }
        client.cancelAll()
        return report.withLock { report in
            report.seconds = (ContinuousClock.now - started).seconds
            return report
        }
    }
}
