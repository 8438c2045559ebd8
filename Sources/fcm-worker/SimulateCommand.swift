import FCM
import Foundation
import Simulator
import Worker
import XMPP
import Runtime

/// `fcm-worker simulate`: a simulated CCS on loopback with a generated certificate.
enum SimulateCommand {
    static let usage = """
      fcm-worker simulate [options]   run a simulated FCM connection server (CCS) over TLS, and
                                      FCM's legacy HTTP API beside it (tokens named unregistered-…
                                      or invalid-… fail, old-… get a canonical new-…)
        --host ADDRESS            listen address (default 127.0.0.1)
        --port N                  listen port (default: a free one)
        --sender-id ID            accepted sender ID (default 123456789012)
        --server-key KEY          accepted server key (default: generated)
        --out DIR                 where to write ca.pem and simulator.env (default: a new temp dir)
        --upstream N              inject N upstream messages once a worker has bound
        --upstream-interval MS    pause between injected messages (default 100)
        --drop-after SECONDS      drop the first session this long after it bound (once)
        --keepalive SECONDS       send whitespace keepalives this often
        --ack-delay MS            answer downstream messages after this delay (default 0)
        --upstream-rate R         with --upstream: inject at R msgs/s (0: as fast as CCS flow
                                  control lets them through) instead of --upstream-interval
        --exit-when-acked         with --upstream-rate: exit once every injected message is
                                  acked, printing `stats acked=… p50_us=… p99_us=… p999_us=… max_us=…`
        --niceness N              nice value for session threads (-20…19; below 0 needs root or
                                  CAP_SYS_NICE; the benchmarks pass -10)
        --quiet                   log sessions and protocol violations, not every message
      """

    static func run(_ arguments: [String]) async -> Int32 {
        var options: [String: String] = [:]
        var arguments = arguments
        let exitWhenAcked = arguments.contains("--exit-when-acked")
        let quiet = arguments.contains("--quiet")
        arguments.removeAll { $0 == "--exit-when-acked" || $0 == "--quiet" }
        var index = 0
        let known: Set<String> = ["--host", "--port", "--sender-id", "--server-key", "--out", "--upstream",
                                  "--upstream-interval", "--drop-after", "--keepalive", "--ack-delay", "--upstream-rate", "--niceness"]
        while index < arguments.count {
            let flag = arguments[index]
            guard known.contains(flag), index + 1 < arguments.count else {
                return fail("simulate: unknown option or missing value: \(flag)")
            }
            options[flag] = arguments[index + 1]
            index += 2
        }
        let senderID = options["--sender-id"] ?? "123456789012"
        let serverKey = options["--server-key"] ?? "sim-" + UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "")
        guard let port = Int(options["--port"] ?? "0"), (0...65535).contains(port),
              let upstreamCount = Int(options["--upstream"] ?? "0"), upstreamCount >= 0,
              let interval = Int(options["--upstream-interval"] ?? "100"), interval >= 0,
              let ackDelay = Int(options["--ack-delay"] ?? "0"), ackDelay >= 0,
              let rate = options["--upstream-rate"].map({ Int($0) }) ?? -1,
              let niceness = options["--niceness"].map({ Int32($0).flatMap { (-20...19).contains($0) ? $0 : nil } }) ?? .some(nil) else {
            return fail("simulate: --port, --upstream, --upstream-interval, --ack-delay and --niceness take whole numbers")
        }
        let dropAfter = options["--drop-after"].flatMap(Double.init)
        let keepalive = options["--keepalive"].flatMap(Double.init)
        let host = options["--host"] ?? "127.0.0.1"

        let outDirectory: String
        do {
            outDirectory = try options["--out"] ?? FileManager.default.url(
                for: .itemReplacementDirectory, in: .userDomainMask,
                appropriateFor: FileManager.default.temporaryDirectory, create: true).path
            try FileManager.default.createDirectory(atPath: outDirectory, withIntermediateDirectories: true)
        } catch {
            return fail("simulate: cannot create the output directory: \(error)")
        }

        let logger = Logger(label: "simulator")
        let simulator: CCSSimulator
        let httpSimulator: FCMHTTPSimulator
        do {
            let authority = try CertificateAuthority(commonName: "fcm-worker simulator CA")
            let identity = try authority.issueServerIdentity(dnsNames: ["localhost"], ipAddresses: ["127.0.0.1", "::1"])
            let caPath = outDirectory + "/ca.pem"
            try authority.rootCertificatePEM.write(toFile: caPath, atomically: true, encoding: .utf8)
            var configuration = SimulatorConfiguration(senderID: senderID, serverKey: serverKey, identity: identity)
            configuration.host = host
            configuration.port = port
            configuration.threadNiceness = niceness
            configuration.recordsEvents = false
            configuration.whitespaceKeepaliveInterval = keepalive.map { .milliseconds(Int64($0 * 1000)) }
            if ackDelay > 0 { configuration.responder = { _ in .ack(delay: .milliseconds(ackDelay)) } }
            let load = rate >= 0 ? LoadScript(count: upstreamCount, rate: rate) : nil
            let script = DemoScript(upstreamCount: load == nil ? upstreamCount : 0, interval: .milliseconds(interval),
                                    dropAfter: dropAfter.map { .milliseconds(Int64($0 * 1000)) })
            if load != nil { configuration.recordsEvents = false }
            configuration.onEvent = { event in
                if load == nil && (!quiet || !event.isPerMessage) { logger.info(describe(event)) }
                script.observe(event)
                load?.observe(event)
            }
            simulator = try CCSSimulator(configuration: configuration)
            httpSimulator = try FCMHTTPSimulator(senderID: senderID, serverKey: serverKey, identity: identity, host: host,
                                                 tokenAnswer: Self.httpTokenAnswer, onAnswer: { request, status in
                                                     logger.info("HTTP \(request.path): \(Self.summary(of: request)) → \(status)")
                                                 })
            script.attach(simulator)
            load?.attach(simulator)
            let endpointHost = host.contains(":") ? "[\(host)]" : host
            let envPath = outDirectory + "/simulator.env"
            try """
                FCM_ENDPOINT=\(endpointHost):\(simulator.port)
                FCM_XMPP_DOMAIN=\(configuration.domain)
                FCM_SENDER_ID=\(senderID)
                FCM_SERVER_KEY=\(serverKey)
                FCM_CA_FILE=\(caPath)
                FCM_HTTP_ENDPOINT=\(endpointHost):\(httpSimulator.port)

                """.write(toFile: envPath, atomically: true, encoding: .utf8)
            printLine("""
                simulated CCS listening on \(endpointHost):\(simulator.port) (direct TLS)
                simulated legacy HTTP API on https://\(endpointHost):\(httpSimulator.port) (/fcm/send, /fcm/notification)
                  XMPP domain   \(configuration.domain)
                  sender ID     \(senderID)
                  server key    \(serverKey)
                  CA file       \(caPath)
                  settings      \(envPath) (FCM_* variables for fcm-worker run)
                """)
        } catch {
            return fail("simulate: \(error)")
        }

        let stopped = AsyncStream<Void>.makeStream()
        let trap = SignalTrap { _ in stopped.continuation.finish() }
        let watcher = Task {
            guard exitWhenAcked, upstreamCount > 0, rate >= 0 else { return }
            while simulator.counters.upstreamAcked < upstreamCount { try await Task.sleep(for: .milliseconds(2)) }
            let latencies = LatencySummary(microseconds: simulator.ackLatencyMicroseconds)
            printLine("stats acked=\(simulator.counters.upstreamAcked) p50_us=\(latencies.microseconds(50)) "
                      + "p99_us=\(latencies.microseconds(99)) p999_us=\(latencies.microseconds(99.9)) max_us=\(latencies.sorted.last ?? 0)")
            stopped.continuation.finish()
        }
        for await _ in stopped.stream {}
        watcher.cancel()
        _ = trap
        simulator.stop()
        httpSimulator.stop()
        let counters = simulator.counters
        printLine("simulator stopped: \(counters.sessionsBound) session(s) bound, \(counters.upstreamDelivered) upstream delivered, "
              + "\(counters.upstreamAcked) acked, \(counters.downstreamReceived) downstream received, \(counters.violations) protocol violation(s)")
        return 0
    }

    /// How the HTTP simulator answers a token: `unregistered-…` NotRegistered, `invalid-…`
    /// InvalidRegistration, `old-…` with a canonical id `new-…`, the rest a message id.
    static let httpTokenAnswer: @Sendable (String) -> FCMHTTPSimulator.TokenAnswer = { token in
        if token.hasPrefix("unregistered-") { return .error("NotRegistered") }
        if token.hasPrefix("invalid-") { return .error("InvalidRegistration") }
        if token.hasPrefix("old-") { return .success(canonicalRegistrationID: "new-" + token.dropFirst(4)) }
        return .success()
    }

    /// "3 token(s)" or the operation of a device-group request.
    private static func summary(of request: FCMHTTPSimulator.Request) -> String {
        guard let body = try? JSONValue.parse(request.body) else { return "plain-text form" }
        if let operation = body["operation"]?.stringValue { return "\(operation) group \(body["notification_key_name"]?.stringValue ?? "?")" }
        if case .array(let tokens)? = body["registration_ids"] { return "multicast to \(tokens.count) token(s)" }
        return "to \(body["to"]?.stringValue ?? body["condition"]?.stringValue ?? "?")"
    }

    private static func describe(_ event: SimulatorEvent) -> String {
        switch event {
        case .connected(let session): "session \(session): TCP connection accepted"
        case .authenticationRefused(let session, let reason): "session \(session): authentication refused (\(reason))"
        case .bound(let session, let jid): "session \(session): authenticated and bound as \(jid)"
        case .pingAnswered(let session): "session \(session): ping answered"
        case .upstreamDelivered(let session, let id): "session \(session): delivered upstream \(id)"
        case .upstreamAcked(let session, let id, let latency): "session \(session): upstream \(id) acked after \(latency.formattedSeconds)"
        case .downstreamReceived(let session, let id): "session \(session): downstream \(id) received"
        case .downstreamAnswered(let session, let id, let response): "session \(session): downstream \(id) answered \(response)"
        case .receiptSent(let session, let id): "session \(session): receipt \(id) sent"
        case .drainingSent(let session): "session \(session): CONNECTION_DRAINING sent"
        case .drainingRead(let session): "session \(session): the client has read CONNECTION_DRAINING"
        case .violation(let session, let violation): "session \(session): PROTOCOL VIOLATION: \(violation)"
        case .closed(let session, let reason): "session \(session): closed (\(reason))"
        }
    }

    /// Writes a line to standard output at once (unbuffered, so a reading script sees it).
    private static func printLine(_ text: String) {
        FileHandle.standardOutput.write(Data((text + "\n").utf8))
    }

    private static func fail(_ line: String) -> Int32 {
        FileHandle.standardError.write(Data("fcm-worker: \(line)\n".utf8))
        return 2
    }
}

/// The `--upstream` and `--drop-after` behaviour of `simulate`.
final class DemoScript: @unchecked Sendable {
    private let upstreamCount: Int
    private let interval: Duration
    private let dropAfter: Duration?
    private let lock = NSLock()
    private var simulator: CCSSimulator?
    private var started = false
    private var dropped = false

    init(upstreamCount: Int, interval: Duration, dropAfter: Duration?) {
        self.upstreamCount = upstreamCount
        self.interval = interval
        self.dropAfter = dropAfter
    }

    func attach(_ simulator: CCSSimulator) {
        lock.withLock { self.simulator = simulator }
    }

    func observe(_ event: SimulatorEvent) {
        guard case .bound(let session, _) = event else { return }
        let (simulator, startUpstream, scheduleDrop) = lock.withLock { () -> (CCSSimulator?, Bool, Bool) in
            defer { started = true; dropped = dropped || dropAfter != nil }
            return (self.simulator, !started && upstreamCount > 0, !dropped && dropAfter != nil)
        }
        guard let simulator else { return }
        let count = upstreamCount, interval = self.interval
        if startUpstream {
            Task {
                for number in 1...count {
                    simulator.injectUpstream(from: "demo-device-\(number % 3 + 1)", category: "com.example.demo",
                                             data: ["text": .string("hello \(number)"), "action": .string("demo")])
                    try? await Task.sleep(for: interval)
                }
            }
        }
        if scheduleDrop, let dropAfter {
            Task {
                try? await Task.sleep(for: dropAfter)
                simulator.drop(session: session)
            }
        }
    }
}

/// The `--upstream N --upstream-rate R` load of `simulate`: starts at the first bound session.
///
/// The messages are made before the first session binds, so that making them does not
/// take CPU from the worker the run measures (the simulator shares its cores).
final class LoadScript: @unchecked Sendable {
    private let count: Int
    private let rate: Int
    private let records: [CCSSimulator.UpstreamRecord]
    private let lock = NSLock()
    private var simulator: CCSSimulator?
    private var started = false

    init(count: Int, rate: Int) {
        self.count = count
        self.rate = rate
        self.records = (0..<count).map(Self.record)
    }

    func attach(_ simulator: CCSSimulator) {
        lock.withLock { self.simulator = simulator }
    }

    func observe(_ event: SimulatorEvent) {
        guard case .bound = event else { return }
        let simulator = lock.withLock { () -> CCSSimulator? in
            defer { started = true }
            return started ? nil : self.simulator
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
                try? await Task.sleep(for: .milliseconds(1))
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

extension SimulatorEvent {
    /// True for the events every message causes (left out of a `--quiet` log).
    var isPerMessage: Bool {
        switch self {
        case .upstreamDelivered, .upstreamAcked, .downstreamReceived, .downstreamAnswered, .receiptSent, .pingAnswered: true
        default: false
        }
    }
}
