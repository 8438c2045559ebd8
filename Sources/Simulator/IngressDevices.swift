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
        /// Messages a request carries: 1 posts each to `/v1/messages`; more post them
        /// together to `/v1/messages:batch` (a device coming back online with a queue), all
        /// as the device of the first of them.
        public var batch = 1
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
        /// Messages posted again after a 429 or 503 told their device to come back later.
        public var retried = 0

        public var summary: String {
            let statusText = statuses.sorted { $0.key < $1.key }.map { "\($0.key == 0 ? "no answer" : String($0.key))=\($0.value)" }.joined(separator: " ")
            let outcomeText = outcomes.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
            return "posted \(posted) in \(String(format: "%.2f", seconds)) s: \(statusText) (\(outcomeText))"
                + (retried > 0 ? ", \(retried) posted again after a 429 or 503" : "")
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
        var generator = SystemRandomGenerator()
        // Decided up front, so that the run is the same whatever the answers' order.
        let plan: [(device: Int, message: Int, bad: Bool)] = (0..<settings.messages).map { index in
            let device = index % settings.devices
            let repeatOf = index >= settings.devices && Double.random(in: 0..<1, using: &generator) < settings.duplicateShare
            let bad = Double.random(in: 0..<1, using: &generator) < settings.badTokenShare
            return (device, repeatOf ? index - settings.devices : index, bad)
        }
        let posting = Posting(settings: settings, client: client, plan: plan, authorizations: tokens.map { "Bearer " + $0 },
                              badAuthorization: "Bearer " + badToken)
        await withTaskCancellationHandler {
            await posting.run()
        } onCancel: {
            posting.cancel()
            client.cancelAll()
        }
        client.cancelAll()
        return posting.report
    }
}

/// The posts of one run, each sent from the answer of the one before it in its slot
/// (`inFlight` slots): no task per post, so that the devices cost little next to the
/// ingress they load.
final class Posting: Sendable {
    private struct State {
        var report = IngressDevices.Report()
        var next = 0
        var submitted = 0
        var completed = 0
        var cancelled = false
        var finished: CheckedContinuation<Void, Never>?
    }

    private let settings: IngressDevices.Settings
    private let client: HTTP2Client
    private let plan: [(device: Int, message: Int, bad: Bool)]
    private let authorizations: [String]
    private let badAuthorization: String
    private let started = ContinuousClock.now
    private let state = BlockingLock(State())

    init(settings: IngressDevices.Settings, client: HTTP2Client, plan: [(device: Int, message: Int, bad: Bool)], authorizations: [String],
         badAuthorization: String) {
        self.settings = settings
        self.client = client
        self.plan = plan
        self.authorizations = authorizations
        self.badAuthorization = badAuthorization
    }

    /// Posts every message of the plan (or until cancelled) and returns once each post is answered or failed.
    func run() async {
        await withCheckedContinuation { continuation in
            let resumeNow = state.withLock { state -> Bool in
                state.finished = continuation
                return plan.isEmpty || state.cancelled
            }
            if resumeNow { takeFinished()?.resume() }
            for _ in 0..<min(settings.inFlight, plan.count) { postNext() }
        }
    }

    /// Posts nothing more; those under way end as they are answered or cancelled.
    func cancel() {
        state.withLock { $0.cancelled = true }
        takeFinished()?.resume()
    }

    var report: IngressDevices.Report {
        state.withLock { state in
            state.report.seconds = (ContinuousClock.now - started).seconds
            return state.report
        }
    }

    /// The waiting `run` once every post taken has ended and no more will be.
    private func takeFinished() -> CheckedContinuation<Void, Never>? {
        state.withLock { state in
            guard state.completed == state.submitted, state.next >= plan.count || state.cancelled else { return nil }
            defer { state.finished = nil }
            return state.finished
        }
    }

    private func postNext() {
        let batch = max(1, settings.batch)
        let taken = state.withLock { state -> Range<Int>? in
            guard state.next < plan.count, !state.cancelled else { return nil }
            let range = state.next..<min(plan.count, state.next + batch)
            state.next = range.upperBound
            state.submitted += 1
            return range
        }
        guard let taken else { return }
        let index = taken.lowerBound
        if settings.rate > 0 {
            let due = started + .seconds(Double(index) / Double(settings.rate))
            let wait = due - .now
            if wait > .zero {
                DispatchQueue.global().asyncAfter(deadline: .now() + wait.seconds) { self.post(taken) }
                return
            }
        }
        post(taken)
    }

    /// A device told to come back later (429, 503) posts the same messages again after the
    /// answer's `Retry-After`, as docs/ingress.md asks of clients, up to this many times.
    private static let maximumRetries = 30

    /// Posts the plan's messages `range` in one request: alone to `/v1/messages`, several to
    /// `/v1/messages:batch` (as the first of them's device, with its token).
    private func post(_ range: Range<Int>, attempt: Int = 0) {
        if state.withLock({ $0.cancelled }) { return finish(range.count, status: 0, outcomes: [], sent: .now) }
        let (device, _, bad) = plan[range.lowerBound]
        let messages = range.map { index in
            let message = plan[index].message
            return #"{"message_id":"sim-\#(message)","token":"simulated-token-\#(device)","category":"com.example.simulated","data":{"n":"\#(message)"}}"#
        }
        let (path, body) = messages.count == 1 ? ("/v1/messages", messages[0])
            : ("/v1/messages:batch", #"{"messages":["# + messages.joined(separator: ",") + "]}")
        let sent = ContinuousClock.now
        client.submit(method: "POST", path: path,
                      headers: [("content-type", "application/json"), ("authorization", bad ? badAuthorization : authorizations[device])],
                      body: Array(body.utf8)) { [self] result in
            switch result {
            case .success(let answer) where (answer.status == 429 || answer.status == 503) && attempt < Self.maximumRetries:
                let wait = Double(answer.headers["retry-after"] ?? "") ?? 1
                state.withLock { $0.report.retried += range.count }
                DispatchQueue.global().asyncAfter(deadline: .now() + max(0.05, min(wait, 30))) { self.post(range, attempt: attempt + 1) }
            case .success(let answer):
                finish(range.count, status: answer.status, outcomes: answer.status == 200 ? Self.statuses(of: answer.body) : [], sent: sent)
            case .failure:
                finish(range.count, status: 0, outcomes: [], sent: sent)
            }
        }
    }

    /// A request of `count` messages ended: each is counted with the request's status.
    private func finish(_ count: Int, status: Int, outcomes: [String], sent: ContinuousClock.Instant) {
        let micros = UInt32(clamping: Int((ContinuousClock.now - sent).seconds * 1_000_000))
        state.withLock { state in
            state.completed += 1
            state.report.posted += count
            state.report.statuses[status, default: 0] += count
            for outcome in outcomes { state.report.outcomes[outcome, default: 0] += 1 }
            for _ in 0..<count { state.report.latencies.append(micros) }
        }
        takeFinished()?.resume()
        postNext()
    }

    /// The `status` members of an answer (`{"message_id": …, "status": "…"}`, or a batch's
    /// `{"results": [...]}`), read without a parse, as bytes: through Foundation's string
    /// search this was an eighth of the devices' CPU.
    static func statuses(of body: String) -> [String] {
        var body = body
        return body.withUTF8 { bytes in
            let key = Array(#""status":""#.utf8)
            var found: [String] = []
            var from = 0
            while let at = bytes.firstOffset(ofBytes: key, from: from) {
                let start = at + key.count
                guard let end = bytes[start...].firstIndex(of: UInt8(ascii: "\"")) else { break }
                found.append(String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<end]), as: UTF8.self))
                from = end
            }
            return found
        }
    }
}
