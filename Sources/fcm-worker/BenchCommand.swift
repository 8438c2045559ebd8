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

/// `fcm-worker bench upstream|downstream`: measured figures, printed.
enum BenchCommand {
    /// The settings of both benchmarks.
    struct Settings: Sendable {
        var databaseURL = ProcessInfo.processInfo.environment["DATABASE_URL"] ?? ""
        var messages = 200_000
        var connections = 4
        var durableConnections = 8
        var concurrency = 4
        var rate = 10_000
        var rateSeconds = 5
        var phases: Set<UpstreamBench.Phase> = [.floor, .ceiling, .immediate, .journal, .durable, .latency]
        /// `bench upstream --pooler-url`: a transaction pooler in front of the same server.
        var poolerURL = ProcessInfo.processInfo.environment["FCM_BENCH_POOLER_URL"]
        var runs: [DownstreamBench.Run] = "1@20,4@20,16@20,16@1".split(separator: ",").compactMap(DownstreamBench.Run.init)
        var seconds = 5
        var reference = 100_000
        var multicastRows = 200
        var statementRows = 100_000
        /// `bench downstream --transport`: xmpp alone, or v1 paired with xmpp.
        var transport = "xmpp"
        var minutes = 30.0
        var upstreamRate = 1000
        /// `bench upstream --source`: where upstream messages come from.
        var source = UpstreamBench.Source.ccs
        var h2load = true
        var downstreamRate = 300
        var ackMode = CCSAckMode.journal
        var faultSeconds = 30
        var faults = SoakBench.Fault.allCases
    }

    private static func positive(_ flag: String, placeholder: String = "N", default value: String, help: String,
                                 _ keyPath: any WritableKeyPath<Settings, Int> & Sendable) -> CommandOption<Settings> {
        CommandOption(flag, placeholder: placeholder, default: value, help: help) { settings, text throws(ConfigurationError) in
            guard let number = Int(text), number > 0 else { throw ConfigurationError("bench: \(flag) takes a positive whole number") }
            settings[keyPath: keyPath] = number
        }
    }

    private static let databaseURL = CommandOption<Settings>("--database-url", environment: "DATABASE_URL", placeholder: "URL",
                                                             default: "$DATABASE_URL", help: "the PostgreSQL to measure against") { settings, text throws(ConfigurationError) in
        settings.databaseURL = text
    }

    static let upstreamOptions = OptionTable<Settings>([
        positive("--messages", default: "200000", help: "messages per throughput run", \.messages),
        positive("--connections", default: "4", help: "CCS connections", \.connections),
        positive("--durable-connections", default: "8",
                 help: "CCS connections of the durable-mode run (acks wait for the commit, so CCS's 100 unacked per connection bound the batches)",
                 \.durableConnections),
        positive("--concurrency", default: "4", help: "handling lanes", \.concurrency),
        CommandOption("--source", placeholder: "ccs|https", default: "ccs",
                      help: "https: each throughput run over CCS is paired with one through the HTTPS ingress (HTTP/2, many devices), and the ratios printed") { settings, text throws(ConfigurationError) in
            guard let source = UpstreamBench.Source(rawValue: text) else { throw ConfigurationError("bench: --source takes ccs or https") }
            settings.source = source
        },
        .toggle("--no-h2load", help: "with --source https: skip the run driven by h2load (nghttp2-client)") { settings, on in settings.h2load = !on },
        positive("--rate", default: "10000", help: "offered load of the latency run, msgs/s", \.rate),
        positive("--rate-seconds", default: "5", help: "length of the latency run", \.rateSeconds),
        CommandOption("--phases", placeholder: "LIST", default: "floor,ceiling,immediate,journal,durable,latency",
                      help: "which parts to run (the ratios need floor and ceiling)") { settings, text throws(ConfigurationError) in
            let names = text.split(separator: ",")
            let phases = Set(names.compactMap { UpstreamBench.Phase(rawValue: String($0)) })
            guard phases.count == Set(names).count, !phases.isEmpty else {
                throw ConfigurationError("bench: --phases takes a list of floor, ceiling, immediate, journal, durable, latency, pooled")
            }
            settings.phases = phases
        },
        CommandOption("--pooler-url", environment: "FCM_BENCH_POOLER_URL", placeholder: "URL", default: "none",
                      help: "the pooled phase: a postgresql:// URL of PgBouncer in transaction mode in front of the same server (its database part is replaced by the bench's own)") { settings, text throws(ConfigurationError) in
            guard text.hasPrefix("postgresql://") || text.hasPrefix("postgres://") else {
                throw ConfigurationError("bench: --pooler-url takes a postgresql:// URL")
            }
            settings.poolerURL = text
        },
        databaseURL,
    ], finish: { settings throws(ConfigurationError) in
        try requireDatabase(&settings)
        if settings.phases.contains(.pooled), settings.poolerURL == nil {
            throw ConfigurationError("bench: the pooled phase needs --pooler-url (scripts/bench starts a PgBouncer for it)")
        }
    })

    static let downstreamOptions = OptionTable<Settings>([
        CommandOption("--runs", placeholder: "LIST", default: "1@20,4@20,16@20,16@1",
                      help: "connections@round-trip-milliseconds of each run") { settings, text throws(ConfigurationError) in
            let runs = text.split(separator: ",").map(DownstreamBench.Run.init)
            guard !runs.isEmpty, runs.allSatisfy({ $0 != nil }) else {
                throw ConfigurationError("bench: --runs takes connections@milliseconds,…")
            }
            settings.runs = runs.compactMap { $0 }
        },
        positive("--seconds", default: "5", help: "each run sends about this many seconds' worth of its bound", \.seconds),
        CommandOption("--transport", placeholder: "xmpp|v1", default: "xmpp",
                      help: "xmpp: CCS connections; v1: FCM's HTTP v1 API over as many HTTP/2 connections (100 streams each), "
                          + "each run paired with the XMPP transport at the same latency and connection count") { settings, text throws(ConfigurationError) in
            guard ["xmpp", "v1"].contains(text) else { throw ConfigurationError("bench: --transport takes xmpp or v1") }
            settings.transport = text
        },
        CommandOption("--reference", placeholder: "N", default: "100000",
                      help: "upstream messages stored before the first run and after each run; a run's CPU per message is compared with the mean of the two on either side of it (0: none)") { settings, text throws(ConfigurationError) in
            guard let number = Int(text), number >= 0 else { throw ConfigurationError("bench: --reference takes a whole number") }
            settings.reference = number
        },
        CommandOption("--multicast-rows", placeholder: "N", default: "200",
                      help: "HTTP multicast rows of 1000 tokens each sent after the runs (0: none)") { settings, text throws(ConfigurationError) in
            guard let number = Int(text), number >= 0 else { throw ConfigurationError("bench: --multicast-rows takes a whole number") }
            settings.multicastRows = number
        },
        CommandOption("--statement-rows", placeholder: "N", default: "100000",
                      help: "rows taken through the outbox's statements alone, without sending, and through the least any "
                          + "design keeping each row's status could cost, after the runs (0: none)") { settings, text throws(ConfigurationError) in
            guard let number = Int(text), number >= 0 else { throw ConfigurationError("bench: --statement-rows takes a whole number") }
            settings.statementRows = number
        },
        databaseURL,
    ], finish: requireDatabase)

    static let soakOptions = OptionTable<Settings>([
        CommandOption("--minutes", placeholder: "M", default: "30", help: "how long the load runs (fractions allowed)") { settings, text throws(ConfigurationError) in
            guard let minutes = Double(text), minutes > 0, minutes.isFinite else { throw ConfigurationError("bench: --minutes takes a positive number") }
            settings.minutes = minutes
        },
        positive("--upstream-rate", default: "1000", help: "upstream messages a second", \.upstreamRate),
        positive("--downstream-rate", default: "300", help: "outbox rows a second", \.downstreamRate),
        positive("--fault-every", placeholder: "SECONDS", default: "30",
                 help: "seconds between faults (in turn: a dropped connection, a drain, a nack burst, the database sessions ended)",
                 \.faultSeconds),
        CommandOption("--faults", placeholder: "LIST", default: "drop,drain,nack,database", help: "the faults that take turns") { settings, text throws(ConfigurationError) in
            let faults = text.split(separator: ",").map { SoakBench.Fault(rawValue: String($0)) }
            guard !faults.isEmpty, faults.allSatisfy({ $0 != nil }) else {
                throw ConfigurationError("bench: --faults takes a list of drop, drain, nack, database")
            }
            settings.faults = faults.compactMap { $0 }
        },
        CommandOption("--ack-mode", placeholder: "MODE", default: "journal", help: "immediate, journal or durable") { settings, text throws(ConfigurationError) in
            guard let mode = CCSAckMode(rawValue: text) else { throw ConfigurationError("bench: --ack-mode takes immediate, journal or durable") }
            settings.ackMode = mode
        },
        databaseURL,
    ], finish: requireDatabase)

    @Sendable private static func requireDatabase(_ settings: inout Settings) throws(ConfigurationError) {
        guard !settings.databaseURL.isEmpty else {
            throw ConfigurationError("bench: missing database URL: pass --database-url or set DATABASE_URL")
        }
    }

    static let command = WorkerCommand(
        name: "bench", synopsis: "upstream|downstream|soak [options]",
        summary: "measure throughput and latency through the simulator over TLS into PostgreSQL, and print the figures; "
            + "or soak: long mixed load with faults, failing on losses or growth",
        options: "bench upstream:\n\(upstreamOptions.help)\nbench downstream:\n\(downstreamOptions.help)\nbench soak:\n\(soakOptions.help)") { arguments, context in
            guard let mode = arguments.first, ["upstream", "downstream", "soak"].contains(mode) else {
                if arguments.first == "--help" || arguments.first == "-h" {
                    print(context.command?.help(program: context.program) ?? "", terminator: "")
                    return 0
                }
                return context.fail("bench: expected `bench upstream`, `bench downstream` or `bench soak` (see \(context.program) help bench)")
            }
            var status: Int32 = 0
            let table = mode == "upstream" ? upstreamOptions : mode == "soak" ? soakOptions : downstreamOptions
            guard let (settings, positional) = context.parse(Array(arguments.dropFirst()), with: table,
                                                             into: Settings(), status: &status) else { return status }
            if let extra = positional.first { return context.fail("bench: unexpected argument \(extra)") }
            do {
                if mode == "soak" {
                    let passed = try await SoakBench(databaseURL: settings.databaseURL, minutes: settings.minutes,
                                                     upstreamRate: settings.upstreamRate, downstreamRate: settings.downstreamRate,
                                                     ackMode: settings.ackMode, faultInterval: .seconds(settings.faultSeconds),
                                                     faults: settings.faults).run()
                    return passed ? 0 : 1
                } else if mode == "downstream" {
                    try await DownstreamBench(databaseURL: settings.databaseURL, runs: settings.runs, seconds: settings.seconds,
                                              referenceMessages: settings.reference, multicastRows: settings.multicastRows,
                                              statementRows: settings.statementRows, transport: settings.transport).run()
                } else {
                    try await UpstreamBench(databaseURL: settings.databaseURL, messages: settings.messages, connections: settings.connections,
                                            durableConnections: settings.durableConnections, concurrency: settings.concurrency,
                                            rate: settings.rate, rateSeconds: settings.rateSeconds, phases: settings.phases,
                                            poolerURL: settings.poolerURL, source: settings.source, h2load: settings.h2load).run()
                }
                return 0
            } catch {
                return context.fail("bench: \(error)", status: 1)
            }
        }
}

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
                say(String(format: "%@ ack mode through the HTTPS ingress (HTTP/2, %d devices): answered %.0f msgs/s, persisted %.0f msgs/s, "
                           + "worker CPU %.1f µs per message", mode.rawValue, Self.httpsDevices, https.ackedPerSecond, https.persistedPerSecond, httpsCPU))
                say("  answer latency (devices-measured) \(https.ackLatency); receive-to-commit \(https.commitLatency)")
                say(String(format: "  HTTPS / CCS: persisted %.2f×, worker CPU per message %.2f×", https.persistedPerSecond / result.persistedPerSecond,
                           httpsCPU / ccsCPU))
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
        let setup = try await Setup.start(url: url, connections: connections(for: mode),
                                          concurrency: concurrency, mode: mode, messages: messages, rate: 0, directURL: directURL,
                                          source: source)
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
        let setup = try await Setup.start(url: url, connections: 1, concurrency: concurrency, mode: mode, messages: 1, rate: 0, source: .https,
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
        let setup = try await Setup.start(url: url, connections: connections, concurrency: concurrency, mode: mode,
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

/// CPU per message of a reference run, for ratios within one session.
struct CPUReference {
    let messages: Int
    let persistedPerSecond: Double
    /// Per stored message.
    let spent: CPUAccount.Spent
}

/// The benchmark's own schema, and what it reads about this process.
enum BenchDatabase {
    /// Runs `body` with the URL of a fresh, migrated schema of its own, dropped afterwards
    /// (also when `body` throws).
    static func withSchema(in databaseURL: String, _ body: (String) async throws -> Void) async throws {
        let schema = "bench_\(UInt32.random(in: 0...UInt32.max))"
        let url = try await makeSchema(schema, in: databaseURL)
        do {
            try await body(url)
        } catch {
            try? await dropSchema(schema, in: databaseURL)
            throw error
        }
        try? await dropSchema(schema, in: databaseURL)
    }

    /// `url` (a `postgresql://` URL) with its database part replaced by `database`.
    static func url(_ url: String, database: String) throws -> String {
        guard let scheme = url.range(of: "://") else { throw ConfigurationError("bench: \(url) is not a postgresql:// URL") }
        let rest = url[scheme.upperBound...]
        let query = rest.firstIndex(of: "?") ?? rest.endIndex
        let slash = rest[..<query].firstIndex(of: "/") ?? query
        return String(url[..<slash]) + "/" + database + String(rest[query...])
    }

    /// Creates `schema` in the database at `databaseURL`, migrates it, and returns a URL
    /// whose sessions use it.
    private static func makeSchema(_ schema: String, in databaseURL: String) async throws -> String {
        try await PostgresConnection.withConnection(databaseURL) { try await $0.execute("CREATE SCHEMA \(schema)") }
        let url = databaseURL + (databaseURL.contains("?") ? "&" : "?") + "options=-csearch_path%3D\(schema)"
        try await PostgresConnection.withConnection(url) { try await Migrator(sets: [.worker]).migrate($0) }
        return url
    }

    private static func dropSchema(_ schema: String, in databaseURL: String) async throws {
        try await PostgresConnection.withConnection(databaseURL) { try await $0.execute("DROP SCHEMA \(schema) CASCADE") }
    }

    /// This process's peak resident set (VmHWM), in MB.
    static func peakResidentMegabytes() -> Int {
        guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8),
              let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmHWM:") }),
              let kilobytes = line.split(separator: " ").dropFirst().first.flatMap({ Int($0) }) else { return -1 }
        return kilobytes / 1024
    }
}

/// A simulator process and an in-process worker wired together for one benchmark phase.
///
/// The simulator runs as its own process (`fcm-worker simulate --upstream-rate …
/// --exit-when-acked`), so this process's CPU profile and peak RSS are the worker's.
final class Setup: Sendable {
    final class Commits: Sendable {
        private let state = BlockingLock((count: 0, latencies: [UInt32](), firstConnection: ContinuousClock.Instant?.none))
        private let port = BlockingLock<Int?>(nil)
        var ingressPort: Int? { port.withLock { $0 } }
        func serving(_ ingress: Int) { port.withLock { $0 = ingress } }
        var count: Int { state.withLock { $0.count } }
        var latencies: [UInt32] { state.withLock { $0.latencies } }
        var firstConnection: ContinuousClock.Instant? { state.withLock { $0.firstConnection } }
        func connected() { state.withLock { if $0.firstConnection == nil { $0.firstConnection = .now } } }
        func record(_ handled: [(String, Date)]) {
            let now = Date()
            state.withLock { state in
                state.count += handled.count
                for (_, receivedAt) in handled {
                    state.latencies.append(UInt32(clamping: Int(now.timeIntervalSince(receivedAt) * 1_000_000)))
                }
            }
        }
    }

    let committed = Commits()
    private let simulator: SimulatorProcess
    private let task = BlockingLock<Task<Void, any Error>?>(nil)
    private let worker = BlockingLock<FCMWorker?>(nil)

    private init(simulator: SimulatorProcess) {
        self.simulator = simulator
    }

    /// - Parameters:
    ///   - source: `https`: the worker serves its ingress on a free port, and (with
    ///     `postsItself`) the simulator's devices post `messages` to it.
    static func start(url: String, connections: Int, concurrency: Int, mode: WorkerConfiguration.AckMode,
                      messages: Int, rate: Int, directURL: String? = nil, source: UpstreamBench.Source = .ccs,
                      postsItself: Bool = true) async throws -> Setup {
        let ingressPort = source == .https ? try Self.freePort() : 0
        let arguments = source == .ccs
            ? ["--upstream", "\(messages)", "--upstream-rate", "\(rate)", "--exit-when-acked"]
            : postsItself ? ["--post-to", "127.0.0.1:\(ingressPort)", "--post-messages", "\(messages)", "--post-devices", "\(UpstreamBench.httpsDevices)",
                             "--post-in-flight", "512", "--post-connections", "16", "--exit-when-posted", "--quiet"]
                          : ["--quiet"]
        let process = try await SimulatorProcess.start(arguments: arguments, capturesOutput: true)
        let setup = Setup(simulator: process)
        let out = process.directory
        let environment = process.environment
        var configuration = try WorkerConfiguration.parse(arguments: [], environment: environment)
        configuration.databaseURL = url
        if let directURL {
            configuration.databasePooler = .transaction
            configuration.databaseDirectURL = directURL
        }
        configuration.connections = connections
        configuration.concurrency = concurrency
        configuration.pipeline.partitions = concurrency
        configuration.ackMode = mode
        configuration.spoolFile = out + "/spool"
        if source == .https {
            var ingress = configuration.ingressSettings
            ingress.address = "127.0.0.1:\(ingressPort)"
            ingress.certificateFile = out + "/ingress-cert.pem"
            ingress.keyFile = out + "/ingress-key.pem"
            ingress.ratePerSecond = 1_000_000
            ingress.rateBurst = 1_000_000
            ingress.maximumStreamsPerConnection = 256
            configuration.ingressSettings = ingress
        }
        var handlers = UpstreamHandlers()
        handlers.register("store", StoreHandler())
        let worker = FCMWorker(configuration: configuration, handlers: handlers, logger: Logger(label: "bench", minimumLevel: .error),
                               observer: { [committed = setup.committed] event in
                                   switch event {
                                   case .committed(let handled, _, _): committed.record(handled)
                                   case .connected where source == .ccs: committed.connected()
                                   case .servingIngress(let port) where source == .https: committed.connected(); committed.serving(port)
                                   default: break
                                   }
                               })
        setup.worker.withLock { $0 = worker }
        setup.task.withLock { $0 = Task { try await worker.run() } }
        return setup
    }

    /// Journal mode's flushes so far: how many, their mean time and size (from the metrics page).
    func journalFlushes() -> String? {
        guard let page = worker.withLock({ $0 })?.metricsPage else { return nil }
        var values: [String: Double] = [:]
        for line in page.split(separator: "\n") where line.hasPrefix("fcm_worker_journal_flush_") {
            let parts = line.split(separator: " ")
            if parts.count == 2, let value = Double(parts[1]) { values[String(parts[0])] = value }
        }
        guard let count = values["fcm_worker_journal_flush_seconds_count"], count > 0 else { return nil }
        return String(format: "%.0f flushes, %.2f ms and %.1f messages each on average", count,
                      (values["fcm_worker_journal_flush_seconds_sum"] ?? 0) / count * 1000,
                      (values["fcm_worker_journal_flush_messages_sum"] ?? 0) / count)
    }

    /// The simulator's folder (its CA, tokens, the ingress certificate).
    var directory: String { simulator.directory }

    /// The port of the worker's ingress, once it serves.
    func ingressPort() async throws -> Int {
        let deadline = ContinuousClock.now + .seconds(30)
        while committed.ingressPort == nil {
            guard ContinuousClock.now < deadline else { throw SimulatorError("the worker's ingress did not start") }
            try await Task.sleep(for: .milliseconds(5))
        }
        return committed.ingressPort!
    }

    /// A port free now (the system's choice, released at once).
    static func freePort() throws -> Int {
        let listener = try TCPListener.open(host: "127.0.0.1", port: 0, nonBlocking: false)
        close(listener.fd)
        return listener.port
    }

    /// When the worker's first connection was up.
    func firstConnection() async throws -> ContinuousClock.Instant {
        while committed.firstConnection == nil { try await Task.sleep(for: .milliseconds(1)) }
        return committed.firstConnection!
    }

    /// Waits until the simulator has seen every message acked (it then exits) and returns
    /// when, with its ack-latency summary.
    func waitForAllAcked(limit: Duration) async throws -> (ContinuousClock.Instant, String) {
        let deadline = ContinuousClock.now + limit
        while simulator.isRunning {
            guard ContinuousClock.now < deadline else { throw SimulatorError("not every message was acked within \(limit)") }
            try await Task.sleep(for: .milliseconds(1))
        }
        let ackedAt = ContinuousClock.now
        var line: String?
        for _ in 0..<500 {
            line = simulator.output?.split(separator: "\n").first { $0.hasPrefix("stats ") }.map(String.init)
            if line != nil { break }
            try await Task.sleep(for: .milliseconds(2))
        }
        return (ackedAt, Self.describe(line))
    }

    /// `stats acked=… p50_us=…` as "p50 x ms, p99 …".
    private static func describe(_ line: String?) -> String {
        guard let line else { return "no statistics from the simulator" }
        var values: [String: Double] = [:]
        for field in line.split(separator: " ").dropFirst() {
            let parts = field.split(separator: "=")
            if parts.count == 2, let value = Double(parts[1]) { values[String(parts[0])] = value }
        }
        func ms(_ key: String) -> String { String(format: "%.2f ms", (values[key] ?? .nan) / 1000) }
        return "p50 \(ms("p50_us")), p99 \(ms("p99_us")), p99.9 \(ms("p999_us")), max \(ms("max_us")) (\(Int(values["acked"] ?? 0)) samples)"
    }

    /// Stops the worker gracefully, then the simulator.
    func shutdown() async {
        let task = self.task.withLock { $0 }
        worker.withLock { $0 }?.requestShutdown()
        _ = try? await task?.value
        simulator.stop()
    }

    /// Best-effort stop on error paths.
    func stop() {
        task.withLock { $0 }?.cancel()
        simulator.stop()
    }
}

/// Prints a line at once (standard output may be a file or pipe, where `print` buffers).
func say(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}
