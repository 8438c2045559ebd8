import Benchmarks
import FCM
import Foundation
import Handlers
import Postgres
import Runtime
import Simulator
import Synchronization
import Transport
import Worker
import XMPP

/// The upstream benchmark (docs/performance.md).
struct UpstreamBench {
    let databaseURL: String
    let messages: Int
    let connections: Int
    /// Connections of the durable-mode run.
    let durableConnections: Int
    let concurrency: Int
    let rate: Int
    let rateSeconds: Int
    let phases: Set<Phase>
    /// A transaction pooler in front of the same server (the pooled phase).
    var poolerURL: String? = nil
    /// `https`: each throughput run over CCS is paired with one through the ingress.
    var source = Source.ccs
    /// With `https`: also drive the ingress with h2load when it is installed.
    var h2load = true
    /// With `https`: messages a simulated device's request carries.
    var httpsBatch = 1

    /// Where the upstream messages of a run come from.
    enum Source: String, Sendable {
        /// The simulated CCS, over the worker's XMPP connections.
        case ccs
        /// Simulated devices posting to the worker's HTTPS ingress (HTTP/2, TLS, ID tokens).
        case https
    }

    /// The parts of the benchmark, in the order they run. `floor` is the receive path's
    /// own parsers alone (`UpstreamReceiveFloor`); `pooled` (not run by default) pairs
    /// immediate-mode runs through a transaction pooler and straight to PostgreSQL.
    enum Phase: String, Sendable {
        case floor, ceiling, immediate, journal, durable, latency, pooled
    }

    func run() async throws {
        say("fcm-worker bench upstream: \(messages) messages per run, \(connections) connection(s) "
              + "(\(durableConnections) in durable mode), \(concurrency) lane(s), "
              + "\(ProcessInfo.processInfo.activeProcessorCount) cores; simulator in its own process, TLS on loopback")
        if phases != [.pooled] {
            try await BenchDatabase.withSchema(in: databaseURL) { url in try await measure(url: url) }
        }
        if phases.contains(.pooled), let poolerURL { try await measurePooled(poolerURL) }
    }

    /// Immediate-mode runs through the pooler (`--database-pooler transaction`, LISTEN and
    /// nothing else over a direct URL) and straight to PostgreSQL, in a database of the
    /// bench's own (a pooler cannot pass the schema option the other phases use), two
    /// pairs, alternating.
    private func measurePooled(_ poolerURL: String) async throws {
        let name = "fcm_bench_\(UInt32.random(in: 0...UInt32.max))"
        let direct = try BenchDatabase.url(databaseURL, database: name)
        let pooled = try BenchDatabase.url(poolerURL, database: name)
        try await PostgresConnection.withConnection(databaseURL) { try await $0.execute("CREATE DATABASE \(name)") }
        do {
            try await measurePooled(direct: direct, pooled: pooled)
        } catch {
            _ = try? await PostgresConnection.withConnection(databaseURL) { try await $0.execute("DROP DATABASE IF EXISTS \(name) WITH (FORCE)") }
            throw error
        }
        try await PostgresConnection.withConnection(databaseURL) { try await $0.execute("DROP DATABASE IF EXISTS \(name) WITH (FORCE)") }
    }

    private func measurePooled(direct: String, pooled: String) async throws {
        try await PostgresConnection.withConnection(direct) { try await Migrator(sets: [.worker]).migrate($0) }
        let cpu = await CPUAccount.locate(databaseURL: direct)
        var rates: [(direct: Double, pooled: Double)] = []
        for _ in 0..<2 {
            var pair: [Double] = []
            for throughPooler in [false, true] {
                try await truncate(direct)
                let result = try await throughputRun(url: throughPooler ? pooled : direct, mode: .immediate, cpu: cpu,
                                                     directURL: throughPooler ? direct : nil)
                say(String(format: "%@: immediate mode (%d connections): acked %.0f msgs/s, persisted %.0f msgs/s",
                           throughPooler ? "through PgBouncer (transaction pooling)" : "straight to PostgreSQL",
                           connections, result.ackedPerSecond, result.persistedPerSecond))
                say("  " + CPUAccount.describe(from: result.cpuBefore, to: result.cpuAfter, messages: messages,
                                               cores: ProcessInfo.processInfo.activeProcessorCount))
                pair.append(result.persistedPerSecond)
            }
            rates.append((pair[0], pair[1]))
        }
        say("persisted through the pooler against straight to PostgreSQL, pair by pair: "
            + rates.map { String(format: "%.2f×", $0.pooled / $0.direct) }.joined(separator: ", "))
    }

    private func measure(url: String) async throws {
        // The ceiling is measured again right before each throughput run: this machine's
        // speed drifts by ±15% over minutes, and the ratio should compare like with like.
        var ceiling: Double?
        /// PostgreSQL's CPU per row of the last COPY ceiling, in µs.
        var copyRowCPU: Double?
        let cpu = await CPUAccount.locate(databaseURL: url)
        func measureCeiling() async throws {
            let count = min(messages, 200_000)
            for form in [CeilingForm.insert, .copy] {
                // Both forms write the same ids: each starts from an empty table.
                try await truncate(url)
                let before = cpu.sample()
                let rows = try await rawCeiling(url: url, rows: count, form: form)
                let after = cpu.sample()
                var perRow = ""
                if let micros = CPUAccount.Spent(from: before, to: after, units: count).postgres {
                    perRow = String(format: "; PostgreSQL %.1f µs CPU per row", micros)
                    if form == .copy { copyRowCPU = micros }
                }
                say(String(format: "raw PostgreSQL ceiling: %.0f rows/s (%@, one connection%@)", rows, form.description, perRow))
                if form == .insert { ceiling = rows }
            }
        }
        /// The worker's CPU per message through its parsers alone, in µs.
        var floorCPU: Double?
        if phases.contains(.floor) { floorCPU = try await measureFloor() }
        /// With `https`: the ingress's transport alone, per request, in µs.
        var ingressFloorCPU: Double?
        if phases.contains(.floor) && source == .https { ingressFloorCPU = try await measureIngressFloor() }
        let throughputPhases = [(Phase.immediate, WorkerConfiguration.AckMode.immediate), (.journal, .journal), (.durable, .durable)]
            .filter { phases.contains($0.0) }
        if phases.contains(.ceiling) && throughputPhases.isEmpty { try await measureCeiling() }

        for (_, mode) in throughputPhases {
            if phases.contains(.ceiling) { try await measureCeiling() }
            try await truncate(url)
            let result = try await throughputRun(url: url, mode: mode, cpu: cpu)
            if source == .https {
                try await truncate(url)
                let https = try await throughputRun(url: url, mode: mode, cpu: cpu, source: .https)
                let ccsCPU = CPUAccount.Spent(from: result.cpuBefore, to: result.cpuAfter, units: messages).worker
                let httpsCPU = CPUAccount.Spent(from: https.cpuBefore, to: https.cpuAfter, units: messages).worker
                say(String(format: "%@ ack mode over CCS: persisted %.0f msgs/s, worker CPU %.1f µs per message", mode.rawValue,
                           result.persistedPerSecond, ccsCPU))
                say(String(format: "%@ ack mode through the HTTPS ingress (HTTP/2, %d devices%@): answered %.0f msgs/s, persisted %.0f msgs/s, "
                           + "worker CPU %.1f µs per message", mode.rawValue, Self.httpsDevices,
                           httpsBatch > 1 ? ", \(httpsBatch) messages a request" : "", https.ackedPerSecond, https.persistedPerSecond, httpsCPU))
                say("  answer latency (devices-measured) \(https.ackLatency); receive-to-commit \(https.commitLatency)")
                // The devices, the simulated CCS and PostgreSQL share the machine's cores
                // with the worker: what each costs bounds the rates both ways.
                let cores = ProcessInfo.processInfo.activeProcessorCount
                say("  over CCS: " + CPUAccount.describe(from: result.cpuBefore, to: result.cpuAfter, messages: messages, cores: cores))
                say("  through the ingress: " + CPUAccount.describe(from: https.cpuBefore, to: https.cpuAfter, messages: messages, cores: cores))
                say(String(format: "  HTTPS / CCS: persisted %.2f×, worker CPU per message %.2f×", https.persistedPerSecond / result.persistedPerSecond,
                           httpsCPU / ccsCPU))
                if let ingressFloorCPU, let floorCPU, httpsBatch == 1 {
                    say(String(format: "  the ingress's transport floor (%.1f µs per request) = %.2f× the CCS path's whole CPU per message, "
                               + "%.0f%% of the ingress's", ingressFloorCPU, ingressFloorCPU / ccsCPU, 100 * ingressFloorCPU / httpsCPU))
                    // What the CCS path spends beyond its own floor (queues, lanes, the
                    // database) an ingress message costs too: with the transport floor, the
                    // least it can cost before any token check or body parse.
                    let bound = ingressFloorCPU + max(0, ccsCPU - floorCPU)
                    say(String(format: "  least ingress CPU per message on this transport: its floor + the CCS path's work beyond the CCS floor "
                               + "(%.1f µs) = %.1f µs = %.2f× the CCS path, before the ingress checks a token or parses a body",
                               ccsCPU - floorCPU, bound, bound / ccsCPU))
                }
                if h2load { try await h2loadRun(url: url, mode: mode) }
                continue
            }
            let (before, after) = (result.cpuBefore, result.cpuAfter)
            let share = ceiling.map { String(format: " = %.0f%% of the ceiling", 100 * result.persistedPerSecond / $0) } ?? ""
            say(String(format: "%@ ack mode (%d connections): acked %.0f msgs/s, persisted %.0f msgs/s", mode.rawValue,
                         connections(for: mode),
                         result.ackedPerSecond, result.persistedPerSecond) + share)
            say("  ack latency (simulator-measured) \(result.ackLatency); receive-to-commit \(result.commitLatency)")
            if let journal = result.journal { say("  journal: \(journal)") }
            say("  " + CPUAccount.describe(from: before, to: after, messages: messages, cores: ProcessInfo.processInfo.activeProcessorCount))
            let spent = CPUAccount.Spent(from: before, to: after, units: messages)
            if let perMessage = spent.postgres, let copyRowCPU {
                say(String(format: "  PostgreSQL CPU per stored message %.1f µs = %.2f× its CPU per COPY-ceiling row (%.1f µs)",
                           perMessage, perMessage / copyRowCPU, copyRowCPU))
            }
            if let floorCPU {
                let postgres = spent.postgres.map { String(format: ", %.2f× PostgreSQL's", spent.worker / $0) } ?? ""
                say(String(format: "  worker CPU per stored message %.1f µs = %.2f× the floor (%.1f µs)",
                           spent.worker, spent.worker / floorCPU, floorCPU) + postgres)
            }
        }

        guard phases.contains(.latency) else {
            say("peak RSS of the worker process (the simulator runs as its own process): \(BenchDatabase.peakResidentMegabytes()) MB")
            return
        }
        // The latency of the two modes that ack before the commit, at the same offered load.
        for mode in [WorkerConfiguration.AckMode.immediate, .journal] {
            try await truncate(url)
            let paced = try await pacedRun(url: url, mode: mode)
            say("latency at \(rate) msgs/s offered for \(rateSeconds) s (\(mode.rawValue) mode): ack \(paced.ackLatency); "
                  + "receive-to-commit \(paced.commitLatency); persisted \(paced.persisted) of \(paced.offered)")
        }
        say("peak RSS of the worker process (the simulator runs as its own process): \(BenchDatabase.peakResidentMegabytes()) MB")
    }

    // MARK: Phases

    /// The floor phase: the same messages as the throughput runs, encrypted as the
    /// simulator sends them, replayed through the worker's TLS, XML, CCS decoding, acks and
    /// COPY row encoding on one thread (`UpstreamReceiveFloor`), `floorReplays` times;
    /// returns the median CPU per message in µs.
    private func measureFloor() async throws -> Double {
        let authority = try CertificateAuthority()
        let server = try TLSContext.server(identity: try authority.issueServerIdentity())
        let client = try TLSContext.client(trust: .caPEM(authority.rootCertificatePEM))
        let thread = DedicatedThread(name: "bench-floor")
        defer { thread.shutdown() }
        let messages = self.messages
        var samples: [(cpu: Double, wall: Double, outcome: UpstreamReceiveFloor.Outcome, bytes: Int)] = []
        // Five replays: on these machines one replay differs from the next by up to 15 %.
        for _ in 0..<Self.floorReplays {
            // Recorded and replayed on the thread that owns the recording's TLS end, in
            // slices (a connection each), so that the recordings do not raise the peak RSS
            // the bench reports for the worker; only the replays are timed.
            let sample = try await thread.run {
                var total = (cpu: 0.0, wall: 0.0, outcome: UpstreamReceiveFloor.Outcome(), bytes: 0)
                for start in stride(from: 0, to: messages, by: Self.floorSlice) {
                    let stanzas = (start..<min(messages, start + Self.floorSlice)).map { LoadScript.record($0).stanza }
                    let recording = try UpstreamReceiveFloor.record(stanzas: stanzas, server: server, client: client, serverName: "localhost")
                    let (cpuStart, wallStart) = (Self.threadCPUSeconds(), ContinuousClock.now)
                    let outcome = try UpstreamReceiveFloor.replay(recording)
                    total.cpu += Self.threadCPUSeconds() - cpuStart
                    total.wall += (ContinuousClock.now - wallStart).seconds
                    total.outcome.add(outcome)
                    total.bytes += recording.bytes
                }
                return total
            }
            guard sample.outcome.messages == messages else {
                throw SimulatorError("the floor decoded \(sample.outcome.messages) of \(messages) messages")
            }
            samples.append(sample)
        }
        let perMessage = samples.map { $0.cpu / Double(messages) * 1_000_000 }
        let median = perMessage.sorted()[Self.floorReplays / 2]
        let first = samples[0]
        say(String(format: "floor (one thread: TLS records replayed through the worker's TLS, XML, CCS JSON, acks and COPY rows; "
                    + "%.1f MB in, %.1f MB of acks out, %.1f MB of COPY rows): %.2f µs CPU per message (median of %@), %.0f msgs/s",
                   Double(first.bytes) / 1e6, Double(first.outcome.ackRecordBytes) / 1e6, Double(first.outcome.copyBytes) / 1e6,
                   median, perMessage.map { String(format: "%.2f", $0) }.joined(separator: ", "),
                   Double(messages) / samples.map(\.wall).sorted()[Self.floorReplays / 2]))
        return median
    }

    /// The ingress's floor (with `--source https`): requests as the simulated devices post
    /// them (one message each, `httpsDevices` devices over `IngressDevices`' 16 connections,
    /// 32 streams open on each), encrypted by their TLS end and replayed through the
    /// worker's TLS and HTTP/2 session, each answered as the ingress answers
    /// (`IngressReceiveFloor`), `floorReplays` times; then the same requests with a short
    /// `authorization`, to show what the token's bytes cost. Returns the first's median CPU
    /// per request in µs. (A libnghttp2 client, as h2load, curl and these devices, never
    /// indexes an `authorization` header in HPACK: every request's token arrives as a
    /// Huffman-coded literal, however few devices share a connection.)
    private func measureIngressFloor() async throws -> Double {
        let authority = try CertificateAuthority()
        let server = try TLSContext.server(identity: try authority.issueServerIdentity())
        let client = try TLSContext.client(trust: .caPEM(authority.rootCertificatePEM))
        let issuer = try FirebaseTokenIssuer(projectID: "bench-project")
        let tokens = try (0..<Self.httpsDevices).map { try "Bearer " + issuer.idToken(uid: "simulated-device-\($0)") }
        let thread = DedicatedThread(name: "bench-floor")
        defer { thread.shutdown() }
        let messages = self.messages
        let connections = Self.ingressFloorConnections
        /// The median CPU per request, in µs, of replays whose requests carry `authorization(device)`.
        func replays(authorization: @escaping @Sendable (Int) -> String) async throws
            -> (median: Double, perRequest: [Double], megabytesIn: Double, megabytesOut: Double, requestsPerSecond: Double) {
            var samples: [(cpu: Double, wall: Double, outcome: IngressReceiveFloor.Outcome, bytes: Int)] = []
            for _ in 0..<Self.floorReplays {
                let sample = try await thread.run {
                    var total = (cpu: 0.0, wall: 0.0, outcome: IngressReceiveFloor.Outcome(), bytes: 0)
                    for start in stride(from: 0, to: messages, by: Self.floorSlice) {
                        let connection = (start / Self.floorSlice) % connections
                        let requests = (start..<min(messages, start + Self.floorSlice)).map { number in
                            // The devices of this connection in turn.
                            let device = ((number - start) * connections + connection) % Self.httpsDevices
                            let body = #"{"message_id":"sim-\#(number)","token":"simulated-token-\#(device)","#
                                + #""category":"com.example.simulated","data":{"n":"\#(number)"}}"#
                            return IngressReceiveFloor.Request(path: "/v1/messages",
                                                               headers: [("content-type", "application/json"), ("authorization", authorization(device))],
                                                               body: Array(body.utf8))
                        }
                        let recording = try IngressReceiveFloor.record(requests: requests, window: Self.ingressFloorWindow, server: server,
                                                                       client: client, serverName: "localhost")
                        let (cpuStart, wallStart) = (Self.threadCPUSeconds(), ContinuousClock.now)
                        let outcome = try IngressReceiveFloor.replay(recording)
                        total.cpu += Self.threadCPUSeconds() - cpuStart
                        total.wall += (ContinuousClock.now - wallStart).seconds
                        total.outcome.add(outcome)
                        total.bytes += recording.bytes
                    }
                    return total
                }
                guard sample.outcome.requests == messages else {
                    throw SimulatorError("the ingress floor answered \(sample.outcome.requests) of \(messages) requests")
                }
                samples.append(sample)
            }
            let perRequest = samples.map { $0.cpu / Double(messages) * 1_000_000 }
            return (perRequest.sorted()[Self.floorReplays / 2], perRequest, Double(samples[0].bytes) / 1e6,
                    Double(samples[0].outcome.answerRecordBytes) / 1e6, Double(messages) / samples.map(\.wall).sorted()[Self.floorReplays / 2])
        }
        let floor = try await replays { tokens[$0] }
        say(String(format: "ingress floor (one thread: TLS records of HTTP/2 requests, one message each, from %d devices over %d connections, "
                    + "replayed through the worker's TLS and HTTP/2 session and answered; %.1f MB in, %.1f MB out): "
                    + "%.2f µs CPU per request (median of %@), %.0f requests/s",
                   Self.httpsDevices, connections, floor.megabytesIn, floor.megabytesOut, floor.median,
                   floor.perRequest.map { String(format: "%.2f", $0) }.joined(separator: ", "), floor.requestsPerSecond))
        // The same requests with a short `authorization`: what the token's bytes cost (HPACK
        // decodes every request's token: nghttp2-based clients never index that header).
        let short = try await replays { "Bearer device-\($0)" }
        say(String(format: "  the same with a %d-byte authorization instead of the ID token's %d: %.2f µs CPU per request (median of %@); "
                    + "the token costs %.2f µs a request",
                   "Bearer device-999".utf8.count, tokens[0].utf8.count, short.median,
                   short.perRequest.map { String(format: "%.2f", $0) }.joined(separator: ", "), floor.median - short.median))
        return floor.median
    }

    /// The simulated devices' connections to the ingress, and the streams each keeps open
    /// (`BenchSetup`: 512 posts in flight over 16 connections).
    private static let ingressFloorConnections = 16
    private static let ingressFloorWindow = 32

    /// How many times the floor phase replays the messages (it prints the median).
    private static let floorReplays = 5
    /// Messages per recording of the floor phase.
    private static let floorSlice = 10_000

    /// This thread's CPU time so far, in seconds.
    private static func threadCPUSeconds() -> Double {
        var time = timespec()
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &time)
        return Double(time.tv_sec) + Double(time.tv_nsec) / 1e9
    }

    /// How the ceiling writes its rows: the worker's old store statement, or its COPY.
    enum CeilingForm: CustomStringConvertible {
        case insert, copy
        var description: String {
            switch self {
            case .insert: "100-row INSERT … SELECT FROM unnest transactions"
            case .copy: "1000-row COPY transactions"
            }
        }
    }

    private func rawCeiling(url: String, rows: Int, form: CeilingForm) async throws -> Double {
        try await PostgresConnection.withConnection(url) { connection in
            let now = Date()
            let started = ContinuousClock.now
            var written = 0
            while written < rows {
                if form == .copy {
                    let count = min(1000, rows - written)
                    let copy = PostgresStatement.copy(
                        into: "upstream_messages", columns: ["message_id", "from_token", "category", "data", "received_at"],
                        rows: (written..<(written + count)).map { number in
                            [.text("ceiling-\(number)"), .text("device-\(number % 1000)"), .text("com.example.bench"),
                             .jsonb("{\"n\":\"\(number)\",\"text\":\"benchmark payload\"}"), .timestamptz(now)]
                        })
                    _ = try await connection.pipeline([PostgresStatement("BEGIN"), copy, PostgresStatement("COMMIT")])
                    written += count
                    continue
                }
                let count = min(100, rows - written)
                let ids = (0..<count).map { PostgresValue.text("ceiling-\(written + $0)") }
                _ = try await connection.pipeline([
                    PostgresStatement("BEGIN"),
                    PostgresStatement("""
                        INSERT INTO upstream_messages (message_id, from_token, category, data, received_at)
                        SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::timestamptz[])
                        """, [.array(ids), .array((0..<count).map { .text("device-\(($0 + written) % 1000)") }),
                              .array(Array(repeating: .text("com.example.bench"), count: count)),
                              .array((0..<count).map { .jsonb("{\"n\":\"\(written + $0)\",\"text\":\"benchmark payload\"}") }),
                              .array(Array(repeating: .timestamptz(now), count: count))]),
                    PostgresStatement("COMMIT"),
                ])
                written += count
            }
            return Double(rows) / (ContinuousClock.now - started).seconds
        }
    }

    struct ThroughputResult {
        var ackedPerSecond: Double
        var persistedPerSecond: Double
        var ackLatency: String
        var commitLatency: LatencySummary
        /// Journal mode: its flushes, from the worker's metrics.
        var journal: String?
        /// CPU used so far, before the worker started and once the last message was stored.
        var cpuBefore: CPUAccount.Sample
        var cpuAfter: CPUAccount.Sample
    }

    /// The CPU is sampled while the worker's database sessions are still open: a session's
    /// server process counts (as the postmaster's reaped child) only once it has ended and
    /// been reaped, which after the worker's shutdown may come after the sample.
    /// - Parameter directURL: set when `url` is a transaction pooler: the worker runs with
    ///   `--database-pooler transaction` and this as its direct URL.
    private func throughputRun(url: String, mode: WorkerConfiguration.AckMode, cpu: CPUAccount,
                               directURL: String? = nil, source: Source = .ccs) async throws -> ThroughputResult {
        let cpuBefore = cpu.sample()
        let setup = try await BenchSetup.start(url: url, connections: connections(for: mode),
                                          concurrency: concurrency, mode: mode, messages: messages, rate: 0, directURL: directURL,
                                          source: source, postBatch: httpsBatch)
        defer { setup.stop() }
        let (ackedAt, stats) = try await setup.waitForAllAcked(limit: .seconds(600))
        let started = try await setup.firstConnection()
        while setup.committed.count < messages {
            if ContinuousClock.now - started > .seconds(600) { throw SimulatorError("the run did not finish in 10 minutes") }
            try await Task.sleep(for: .milliseconds(1))
        }
        let persisted = ContinuousClock.now
        let cpuAfter = cpu.sample()
        let result = ThroughputResult(
            ackedPerSecond: Double(messages) / (ackedAt - started).seconds,
            persistedPerSecond: Double(messages) / (persisted - started).seconds,
            ackLatency: stats, commitLatency: LatencySummary(microseconds: setup.committed.latencies),
            journal: mode == .journal ? setup.journalFlushes() : nil, cpuBefore: cpuBefore, cpuAfter: cpuAfter)
        await setup.shutdown()
        return result
    }

    /// What storing an upstream message costs, for another benchmark's comparison in the
    /// same session: an immediate-mode run of `messages` through the `store` handler into
    /// `url`'s schema (its upstream tables emptied before and after).
    static func storeReference(url: String, messages: Int) async throws -> CPUReference {
        let bench = UpstreamBench(databaseURL: url, messages: messages, connections: 4, durableConnections: 8, concurrency: 4,
                                  rate: 1, rateSeconds: 1, phases: [.immediate])
        try await bench.truncate(url)
        let cpu = await CPUAccount.locate(databaseURL: url)
        let result = try await bench.throughputRun(url: url, mode: .immediate, cpu: cpu)
        try await bench.truncate(url)
        return CPUReference(messages: messages, persistedPerSecond: result.persistedPerSecond,
                            spent: CPUAccount.Spent(from: result.cpuBefore, to: result.cpuAfter, units: messages))
    }

    /// Devices posting in an HTTPS run.
    static let httpsDevices = 1000

    /// The ingress driven by h2load (an outside load generator, Debian's nghttp2-client):
    /// one device's token and one body (each request after the first a duplicate, handled
    /// once), 32 connections with 16 streams each; prints h2load's own summary lines.
    private func h2loadRun(url: String, mode: WorkerConfiguration.AckMode) async throws {
        guard let h2load = ["/usr/bin/h2load", "/usr/local/bin/h2load"].first(where: { FileManager.default.isExecutableFile(atPath: $0) }) else {
            say("  h2load: not installed (Debian's nghttp2-client), skipped")
            return
        }
        try await truncate(url)
        let setup = try await BenchSetup.start(url: url, connections: 1, concurrency: concurrency, mode: mode, messages: 1, rate: 0, source: .https,
                                          postsItself: false)
        defer { setup.stop() }
        let port = try await setup.ingressPort()
        let token = try String(contentsOfFile: setup.directory + "/id-token", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        let body = setup.directory + "/h2load-body.json"
        try #"{"message_id":"h2load-1","token":"h2load-device","data":{"text":"hello"}}"#.write(toFile: body, atomically: true, encoding: .utf8)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: h2load)
        process.arguments = ["-n", "\(messages)", "-c", "32", "-m", "16", "-H", "authorization: Bearer \(token)", "-H", "content-type: application/json",
                             "-d", body, "https://127.0.0.1:\(port)/v1/messages"]
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = FileHandle.nullDevice
        try process.run()
        let output = await Task.detached { String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self) }.value
        while process.isRunning { try await Task.sleep(for: .milliseconds(5)) }
        for line in output.split(separator: "\n") where line.hasPrefix("finished in") || line.hasPrefix("requests:") || line.hasPrefix("status codes:")
            || line.hasPrefix("time for request:") {
            say("  h2load (\(mode.rawValue), one device, 32 connections × 16 streams): \(line)")
        }
        await setup.shutdown()
    }

    /// The connections of a throughput run in `mode`.
    private func connections(for mode: WorkerConfiguration.AckMode) -> Int {
        mode == .durable ? durableConnections : connections
    }

    private func pacedRun(url: String, mode: WorkerConfiguration.AckMode) async throws
        -> (ackLatency: String, commitLatency: LatencySummary, persisted: Int, offered: Int) {
        let total = rate * rateSeconds
        let setup = try await BenchSetup.start(url: url, connections: connections, concurrency: concurrency, mode: mode,
                                          messages: total, rate: rate)
        defer { setup.stop() }
        let (_, stats) = try await setup.waitForAllAcked(limit: .seconds(Int64(rateSeconds) + 120))
        let deadline = ContinuousClock.now + .seconds(60)
        while setup.committed.count < total && ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(5)) }
        let result = (stats, LatencySummary(microseconds: setup.committed.latencies), setup.committed.count, total)
        await setup.shutdown()
        return result
    }

    // MARK: Helpers

    private func truncate(_ url: String) async throws {
        try await PostgresConnection.withConnection(url) { connection in
            try await connection.execute("TRUNCATE upstream_messages, processed_upstream, dead_letters")
            try await connection.execute("CHECKPOINT")
        }
    }

}
