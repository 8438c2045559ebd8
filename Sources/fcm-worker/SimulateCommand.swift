import FCM
import Foundation
import Runtime
import Simulator
import Worker
import XMPP

/// `fcm-worker simulate`: a simulated CCS on loopback with a generated certificate.
enum SimulateCommand {
    struct Settings: Sendable {
        var host = "127.0.0.1"
        var port = 0
        var senderID = "123456789012"
        var serverKey = "sim-" + UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "")
        var out: String?
        var upstreamCount = 0
        var upstreamFile: String?
        var interval = 100
        var dropAfter: Double?
        var keepalive: Double?
        var ackDelay = 0
        var rate = -1
        var exitWhenAcked = false
        var niceness: Int32?
        var quiet = false
        var v1Latency = 0
        var v1Streams = 100
        var v1HTTP1Only = false
        /// Devices posting to an HTTPS ingress (`--post-to`).
        var postTo: String?
        var postMessages = 1000
        var postDevices = 100
        var postRate = 0
        var postInFlight = 256
        var postBatch = 1
        var postConnections = 8
        var postDuplicates = 0.0
        var postBadTokens = 0.0
        var exitWhenPosted = false
    }

    private static func share(_ flag: String, help: String, _ apply: @escaping @Sendable (inout Settings, Double) -> Void) -> CommandOption<Settings> {
        CommandOption(flag, placeholder: "SHARE", default: "0", help: help) { settings, text throws(ConfigurationError) in
            guard let value = Double(text), (0...1).contains(value) else { throw ConfigurationError("simulate: \(flag) takes a share from 0 to 1") }
            apply(&settings, value)
        }
    }

    private static func whole(_ flag: String, default value: String, help: String, minimum: Int = 0,
                              _ apply: @escaping @Sendable (inout Settings, Int) -> Void) -> CommandOption<Settings> {
        CommandOption(flag, placeholder: "N", default: value, help: help) { settings, text throws(ConfigurationError) in
            guard let number = Int(text), number >= minimum else { throw ConfigurationError("simulate: \(flag) takes a whole number of at least \(minimum)") }
            apply(&settings, number)
        }
    }

    private static func seconds(_ flag: String, help: String, _ apply: @escaping @Sendable (inout Settings, Double) -> Void) -> CommandOption<Settings> {
        CommandOption(flag, placeholder: "SECONDS", default: "off", help: help) { settings, text throws(ConfigurationError) in
            guard let value = Double(text), value > 0 else { throw ConfigurationError("simulate: \(flag) takes seconds, more than 0") }
            apply(&settings, value)
        }
    }

    static let options = OptionTable<Settings>([
        CommandOption("--host", placeholder: "ADDRESS", default: "127.0.0.1", help: "listen address") { settings, text throws(ConfigurationError) in
            settings.host = text
        },
        whole("--port", default: "a free one", help: "listen port") { $0.port = $1 },
        CommandOption("--sender-id", placeholder: "ID", default: "123456789012", help: "the accepted sender ID") { settings, text throws(ConfigurationError) in
            settings.senderID = text
        },
        CommandOption("--server-key", placeholder: "KEY", default: "generated", help: "the accepted server key") { settings, text throws(ConfigurationError) in
            settings.serverKey = text
        },
        CommandOption("--out", placeholder: "DIR", default: "a new temporary folder",
                      help: "where to write ca.pem and simulator.env (the FCM_* settings a worker needs)") { settings, text throws(ConfigurationError) in
            settings.out = text
        },
        whole("--upstream", default: "0", help: "inject this many upstream messages once a worker has bound") { $0.upstreamCount = $1 },
        CommandOption("--upstream-file", placeholder: "FILE", default: "none",
                      help: "queue the upstream messages of this JSON Lines file (- for standard input): one object per line with data, and from, category, message_id or other members when wanted") { settings, text throws(ConfigurationError) in
            settings.upstreamFile = text
        },
        whole("--upstream-interval", default: "100", help: "milliseconds between injected messages") { $0.interval = $1 },
        whole("--upstream-rate", default: "off",
              help: "with --upstream: inject at this many msgs/s (0: as fast as CCS flow control lets them) instead of --upstream-interval") { $0.rate = $1 },
        .toggle("--exit-when-acked", help: "with --upstream-rate: exit once every injected message is acked, printing `stats acked=… p50_us=… p99_us=… p999_us=… max_us=…`") { $0.exitWhenAcked = $1 },
        seconds("--drop-after", help: "drop the first session this long after it bound (once)") { $0.dropAfter = $1 },
        seconds("--keepalive", help: "send whitespace keepalives this often") { $0.keepalive = $1 },
        whole("--ack-delay", default: "0", help: "answer downstream messages after this many milliseconds") { $0.ackDelay = $1 },
        CommandOption("--niceness", placeholder: "N", default: "unchanged",
                      help: "nice value of the session threads, -20 to 19 (below 0 needs root or CAP_SYS_NICE; the benchmarks pass -10)") { settings, text throws(ConfigurationError) in
            guard let value = Int32(text), (-20...19).contains(value) else { throw ConfigurationError("simulate: --niceness takes -20 to 19") }
            settings.niceness = value
        },
        whole("--v1-latency", default: "0", help: "the v1 API answers after this many milliseconds") { $0.v1Latency = $1 },
        whole("--v1-streams", default: "100", help: "the v1 API's SETTINGS_MAX_CONCURRENT_STREAMS per HTTP/2 connection", minimum: 1) {
            $0.v1Streams = $1
        },
        .toggle("--v1-http1-only", help: "the v1 API offers HTTP/1.1 only (a client's fallback from h2)") { $0.v1HTTP1Only = $1 },
        .toggle("--quiet", help: "log sessions and protocol violations, not every message") { $0.quiet = $1 },
        CommandOption("--post-to", placeholder: "HOST:PORT", default: "off",
                      help: "simulated devices post upstream messages to the HTTPS ingress there (HTTP/2, each with an ID token this simulator minted; its certificate from ingress-cert.pem)") { settings, text throws(ConfigurationError) in
            guard let colon = text.lastIndex(of: ":"), Int(text[text.index(after: colon)...]) != nil else {
                throw ConfigurationError("simulate: --post-to takes HOST:PORT")
            }
            settings.postTo = text
        },
        whole("--post-messages", default: "1000", help: "with --post-to: messages to post", minimum: 1) { $0.postMessages = $1 },
        whole("--post-devices", default: "100", help: "with --post-to: devices posting (each its own uid and token)", minimum: 1) { $0.postDevices = $1 },
        whole("--post-rate", default: "0", help: "with --post-to: messages a second (0: as fast as the answers come)") { $0.postRate = $1 },
        whole("--post-in-flight", default: "256", help: "with --post-to: posts awaiting their answer at once", minimum: 1) { $0.postInFlight = $1 },
        whole("--post-connections", default: "8", help: "with --post-to: HTTP/2 connections", minimum: 1) { $0.postConnections = $1 },
        whole("--post-batch", default: "1", help: "with --post-to: messages a request carries (over 1: POST /v1/messages:batch, at most 100)",
              minimum: 1) { $0.postBatch = min($1, 100) },
        share("--post-duplicates", help: "with --post-to: share of posts that repeat an earlier message (a retry)") { $0.postDuplicates = $1 },
        share("--post-bad-tokens", help: "with --post-to: share of posts with an expired token") { $0.postBadTokens = $1 },
        .toggle("--exit-when-posted", help: "with --post-to: exit once every post is answered, printing `posted …` and `stats acked=… p50_us=…` (answer latency)") {
            $0.exitWhenPosted = $1
        },
    ])

    static let command = WorkerCommand(
        name: "simulate",
        summary: "run a simulated FCM connection server (CCS) over TLS, FCM's legacy HTTP API and its HTTP v1 API "
            + "with Google's token endpoint beside it (tokens named unregistered-… or invalid-… fail, old-… get a canonical new-…; "
            + "over v1 mismatch-… and apns-refused-… fail too)",
        options: options.help) { arguments, context in
            var status: Int32 = 0
            guard let (settings, positional) = context.parse(arguments, with: options, into: Settings(), status: &status) else { return status }
            if let extra = positional.first { return context.fail("simulate: unexpected argument \(extra)") }
            return await run(settings)
        }

    static func run(_ settings: Settings) async -> Int32 {
        let (senderID, serverKey, host, port) = (settings.senderID, settings.serverKey, settings.host, settings.port)
        let (upstreamCount, interval, ackDelay, rate) = (settings.upstreamCount, settings.interval, settings.ackDelay, settings.rate)
        let (dropAfter, keepalive, niceness, quiet, exitWhenAcked) = (settings.dropAfter, settings.keepalive, settings.niceness,
                                                                      settings.quiet, settings.exitWhenAcked)
        let options = ["--out": settings.out].compactMapValues { $0 }
        let outDirectory: String
        do {
            outDirectory = try options["--out"] ?? FileManager.default.url(
                for: .itemReplacementDirectory, in: .userDomainMask,
                appropriateFor: FileManager.default.temporaryDirectory, create: true).path
            try FileManager.default.createDirectory(atPath: outDirectory, withIntermediateDirectories: true)
        } catch {
            return fail("simulate: cannot create the output directory: \(error)")
        }

        // SIGTERM and SIGINT stop it from here on: the files below tell others it runs,
        // and a signal right after they appear must still end it cleanly.
        let stopped = AsyncStream<Void>.makeStream()
        let trap = SignalTrap { _ in stopped.continuation.finish() }
        let logger = Logger(label: "simulator")
        let simulator: CCSSimulator
        let httpSimulator: FCMHTTPSimulator
        let v1Simulator: FCMV1Simulator
        do {
            let authority = try CertificateAuthority(commonName: "fcm-worker simulator CA")
            let identity = try authority.issueServerIdentity(dnsNames: ["localhost"], ipAddresses: ["127.0.0.1", "::1"])
            let caPath = outDirectory + "/ca.pem"
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
            // Only a load run's figures use them; a simulator left running keeps none.
            configuration.recordsAckLatencies = exitWhenAcked && load != nil
            configuration.onEvent = { event in
                if load == nil && (!quiet || !event.isPerMessage) { logger.info(describe(event)) }
                script.observe(event)
                load?.observe(event)
            }
            simulator = try CCSSimulator(configuration: configuration)
            // Written once it listens: a second simulator that cannot bind (its port taken)
            // leaves a running one's CA file as it was.
            try authority.rootCertificatePEM.write(toFile: caPath, atomically: true, encoding: .utf8)
            if let file = settings.upstreamFile {
                let text: String
                if file == "-" {
                    text = String(decoding: FileHandle.standardInput.readDataToEndOfFile(), as: UTF8.self)
                } else {
                    guard let contents = try? String(contentsOfFile: file, encoding: .utf8) else {
                        simulator.stop()
                        return fail("simulate: cannot read the upstream file \(file)")
                    }
                    text = contents
                }
                do {
                    let ids = try simulator.injectUpstream(jsonLines: text)
                    logger.info("queued \(ids.count) upstream message(s) from \(file == "-" ? "standard input" : file)")
                } catch {
                    simulator.stop()
                    return fail("simulate: \(error)")
                }
            }
            httpSimulator = try FCMHTTPSimulator(senderID: senderID, serverKey: serverKey, identity: identity, host: host,
                                                 tokenAnswer: Self.httpTokenAnswer, recordsRequests: false, onAnswer: { request, status in
                                                     logger.info("HTTP \(request.path): \(Self.summary(of: request)) → \(status)")
                                                 })
            var v1Settings = FCMV1Simulator.Settings()
            v1Settings.host = host
            v1Settings.latency = .milliseconds(settings.v1Latency)
            v1Settings.maximumConcurrentStreams = UInt32(settings.v1Streams)
            v1Settings.offersHTTP2 = !settings.v1HTTP1Only
            v1Settings.recordsDeliveries = false
            if !quiet {
                v1Settings.onAnswer = { target, status, protocolName in logger.info("v1 (\(protocolName)) to \(target) → \(status)") }
            }
            v1Simulator = try FCMV1Simulator(identity: identity, settings: v1Settings)
            let accountPath = outDirectory + "/service-account.json"
            // Firebase's tokens for devices posting to an ingress: one of each kind (valid an
            // hour), and the corpus of good and bad tokens the firebase-admin check runs.
            let tokens = v1Simulator.firebaseTokens
            try writePrivately(try tokens.idToken(uid: "simulated-user") + "\n", to: outDirectory + "/id-token")
            // A certificate for an ingress on this machine, from the simulator's CA (ca.pem).
            let ingressIdentity = try authority.issueServerIdentity()
            try ingressIdentity.certificateChainPEM.write(toFile: outDirectory + "/ingress-cert.pem", atomically: true, encoding: .utf8)
            try writePrivately(ingressIdentity.privateKeyPEM, to: outDirectory + "/ingress-key.pem")
            try writePrivately(try tokens.appCheckToken(appID: tokens.sampleAppID) + "\n", to: outDirectory + "/app-check-token")
            let corpus = try tokens.corpus().map { JSONValue.object(["name": .string($0.name), "kind": .string($0.kind.rawValue),
                                                                      "token": .string($0.token), "valid": .bool($0.valid),
                                                                      "stricter": .bool($0.stricter)]) }
            try writePrivately(JSONValue.array(corpus).serialized + "\n", to: outDirectory + "/token-corpus.json")
            // Its private key: readable by its owner only.
            try writePrivately(v1Simulator.account.keyFileJSON, to: accountPath)
            script.attach(simulator)
            load?.attach(simulator)
            let endpointHost = host.contains(":") ? "[\(host)]" : host
            let envPath = outDirectory + "/simulator.env"
            // It holds the server key: readable by its owner only, from its first byte.
            try writePrivately("""
                FCM_ENDPOINT=\(endpointHost):\(simulator.port)
                FCM_XMPP_DOMAIN=\(configuration.domain)
                FCM_SENDER_ID=\(senderID)
                FCM_SERVER_KEY=\(serverKey)
                FCM_CA_FILE=\(caPath)
                FCM_HTTP_ENDPOINT=\(endpointHost):\(httpSimulator.port)
                FCM_V1_ENDPOINT=\(endpointHost):\(v1Simulator.port)
                GOOGLE_APPLICATION_CREDENTIALS=\(accountPath)
                FCM_INGRESS_PROJECT_ID=\(tokens.projectID)
                FCM_INGRESS_PROJECT_NUMBER=\(tokens.projectNumber)
                FCM_INGRESS_ID_TOKEN_KEYS_URL=\(v1Simulator.idTokenKeysURL)
                FCM_INGRESS_APP_CHECK_KEYS_URL=\(v1Simulator.appCheckKeysURL)

                """, to: envPath)
            printLine("""
                simulated CCS listening on \(endpointHost):\(simulator.port) (direct TLS)
                simulated legacy HTTP API on https://\(endpointHost):\(httpSimulator.port) (/fcm/send, /fcm/notification)
                simulated HTTP v1 API on https://\(endpointHost):\(v1Simulator.port) (\(settings.v1HTTP1Only ? "HTTP/1.1" : "HTTP/2 and HTTP/1.1"); \
                project \(v1Simulator.account.projectID), token endpoint \(v1Simulator.tokenURI))
                  XMPP domain   \(configuration.domain)
                  sender ID     \(senderID)
                  server key    \(serverKey)
                  CA file       \(caPath)
                  service acct  \(accountPath) (a key made at start; its token_uri names the simulator)
                  Firebase keys \(v1Simulator.idTokenKeysURL) (ID tokens), \(v1Simulator.appCheckKeysURL) (App Check)
                  device tokens \(outDirectory)/id-token, \(outDirectory)/app-check-token (valid an hour, project \(tokens.projectID))
                  ingress TLS   \(outDirectory)/ingress-cert.pem, \(outDirectory)/ingress-key.pem (for 127.0.0.1 and localhost, from ca.pem)
                  settings      \(envPath) (the variables for fcm-worker run)
                """)
        } catch {
            return fail("simulate: \(error)")
        }

        let watcher = Task {
            guard exitWhenAcked, upstreamCount > 0, rate >= 0 else { return }
            while simulator.counters.upstreamAcked < upstreamCount { try await Task.sleep(for: .milliseconds(2)) }
            let latencies = LatencySummary(microseconds: simulator.ackLatencyMicroseconds)
            printLine("stats acked=\(simulator.counters.upstreamAcked) p50_us=\(latencies.microseconds(50)) "
                      + "p99_us=\(latencies.microseconds(99)) p999_us=\(latencies.microseconds(99.9)) max_us=\(latencies.sorted.last ?? 0)")
            stopped.continuation.finish()
        }
        let poster = Task {
            guard let target = settings.postTo, let colon = target.lastIndex(of: ":"), let port = Int(target[target.index(after: colon)...]) else { return }
            var post = IngressDevices.Settings(port: port, trust: .caFile(outDirectory + "/ca.pem"))
            post.host = String(target[..<colon]).trimmingCharacters(in: CharacterSet(charactersIn: "[]"))
            post.messages = settings.postMessages
            post.devices = settings.postDevices
            post.rate = settings.postRate
            post.inFlight = settings.postInFlight
            post.connections = settings.postConnections
            post.batch = settings.postBatch
            post.duplicateShare = settings.postDuplicates
            post.badTokenShare = settings.postBadTokens
            do {
                let report = try await IngressDevices(settings: post, issuer: v1Simulator.firebaseTokens).run()
                let latencies = LatencySummary(microseconds: report.latencies)
                printLine(report.summary)
                printLine("stats acked=\(report.statuses[200] ?? 0) p50_us=\(latencies.microseconds(50)) "
                          + "p99_us=\(latencies.microseconds(99)) p999_us=\(latencies.microseconds(99.9)) max_us=\(latencies.sorted.last ?? 0)")
            } catch {
                logger.error("posting to \(target): \(error)")
            }
            if settings.exitWhenPosted { stopped.continuation.finish() }
        }
        for await _ in stopped.stream {}
        poster.cancel()
        watcher.cancel()
        _ = trap
        simulator.stop()
        httpSimulator.stop()
        v1Simulator.stop()
        let counters = simulator.counters
        let v1 = v1Simulator.counters
        printLine("simulator stopped: \(counters.sessionsBound) session(s) bound, \(counters.upstreamDelivered) upstream delivered, "
              + "\(counters.upstreamAcked) acked, \(counters.downstreamReceived) downstream received, \(counters.violations) protocol violation(s); "
              + "v1: \(v1.tokensIssued) token(s) issued, \(v1.delivered) message(s) delivered")
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

/// Writes `text` to `path` with mode 0600, whole or not at all: to a file of its own first,
/// renamed into place, so that a reader waiting for `path` never reads it half written.
private func writePrivately(_ text: String, to path: String) throws {
    let temporary = path + ".tmp-\(getpid())"
    let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
    guard fd >= 0 else { throw SimulatorError("cannot write \(temporary): \(String(cString: strerror(errno)))") }
    do {
        defer { close(fd) }
        guard fchmod(fd, 0o600) == 0 else { throw SimulatorError("cannot restrict \(temporary): \(String(cString: strerror(errno)))") }
        let bytes = Array(text.utf8)
        var written = 0
        while written < bytes.count {
            let count = bytes[written...].withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
            if count < 0, errno == EINTR { continue }
            guard count > 0 else { throw SimulatorError("cannot write \(temporary): \(String(cString: strerror(errno)))") }
            written += count
        }
    }
    guard rename(temporary, path) == 0 else {
        let reason = String(cString: strerror(errno))
        unlink(temporary)
        throw SimulatorError("cannot write \(path): \(reason)")
    }
}
