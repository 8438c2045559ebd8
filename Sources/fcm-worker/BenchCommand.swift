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
        var httpsBatch = 1
        var downstreamRate = 300
        var ackMode = CCSAckMode.journal
        var faultSeconds = 30
        var faults = SoakBench.Fault.allCases
        /// `bench connections`: idle connections held, and the probing device's posts.
        var idleConnections = 10_000
        var probePosts = 2000
        /// `bench hold-connections` (the helper `bench connections` runs).
        var holdPort = 0
        var holdCAFile = ""
        /// `bench devices`: connections of the device-shaped load, and seconds a run.
        var deviceConnections = 64
        var deviceSeconds = 5
    }

    private static func positive(_ flag: String, placeholder: String = "N", default value: String, help: String,
                                 _ keyPath: any WritableKeyPath<Settings, Int> & Sendable) -> CommandOption<Settings> {
        CommandOption(flag, placeholder: placeholder, default: value, help: help) { settings, text throws(ConfigurationError) in
            guard let number = Int(text), number > 0 else { throw ConfigurationError("\(flag) takes a positive whole number") }
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
            guard let source = UpstreamBench.Source(rawValue: text) else { throw ConfigurationError("--source takes ccs or https") }
            settings.source = source
        },
        .toggle("--no-h2load", help: "with --source https: skip the run driven by h2load (nghttp2-client)") { settings, on in settings.h2load = !on },
        positive("--https-batch", default: "1",
                 help: "with --source https: messages each simulated device's request carries (over 1: POST /v1/messages:batch, at most 100)",
                 \.httpsBatch),
        positive("--rate", default: "10000", help: "offered load of the latency run, msgs/s", \.rate),
        positive("--rate-seconds", default: "5", help: "length of the latency run", \.rateSeconds),
        CommandOption("--phases", placeholder: "LIST", default: "floor,ceiling,immediate,journal,durable,latency",
                      help: "which parts to run (the ratios need floor and ceiling)") { settings, text throws(ConfigurationError) in
            let names = text.split(separator: ",")
            let phases = Set(names.compactMap { UpstreamBench.Phase(rawValue: String($0)) })
            guard phases.count == Set(names).count, !phases.isEmpty else {
                throw ConfigurationError("--phases takes a list of floor, ceiling, immediate, journal, durable, latency, pooled")
            }
            settings.phases = phases
        },
        CommandOption("--pooler-url", environment: "FCM_BENCH_POOLER_URL", placeholder: "URL", default: "none",
                      help: "the pooled phase: a postgresql:// URL of PgBouncer in transaction mode in front of the same server (its database part is replaced by the bench's own)") { settings, text throws(ConfigurationError) in
            guard text.hasPrefix("postgresql://") || text.hasPrefix("postgres://") else {
                throw ConfigurationError("--pooler-url takes a postgresql:// URL")
            }
            settings.poolerURL = text
        },
        databaseURL,
    ], finish: { settings throws(ConfigurationError) in
        try requireDatabase(&settings)
        if settings.phases.contains(.pooled), settings.poolerURL == nil {
            throw ConfigurationError("the pooled phase needs --pooler-url (scripts/bench starts a PgBouncer for it)")
        }
    })

    static let downstreamOptions = OptionTable<Settings>([
        CommandOption("--runs", placeholder: "LIST", default: "1@20,4@20,16@20,16@1",
                      help: "connections@round-trip-milliseconds of each run") { settings, text throws(ConfigurationError) in
            let runs = text.split(separator: ",").map(DownstreamBench.Run.init)
            guard !runs.isEmpty, runs.allSatisfy({ $0 != nil }) else {
                throw ConfigurationError("--runs takes connections@milliseconds,…")
            }
            settings.runs = runs.compactMap { $0 }
        },
        positive("--seconds", default: "5", help: "each run sends about this many seconds' worth of its bound", \.seconds),
        CommandOption("--transport", placeholder: "xmpp|v1", default: "xmpp",
                      help: "xmpp: CCS connections; v1: FCM's HTTP v1 API over as many HTTP/2 connections (100 streams each), "
                          + "each run paired with the XMPP transport at the same latency and connection count") { settings, text throws(ConfigurationError) in
            guard ["xmpp", "v1"].contains(text) else { throw ConfigurationError("--transport takes xmpp or v1") }
            settings.transport = text
        },
        CommandOption("--reference", placeholder: "N", default: "100000",
                      help: "upstream messages stored before the first run and after each run; a run's CPU per message is compared with the mean of the two on either side of it (0: none)") { settings, text throws(ConfigurationError) in
            guard let number = Int(text), number >= 0 else { throw ConfigurationError("--reference takes a whole number") }
            settings.reference = number
        },
        CommandOption("--multicast-rows", placeholder: "N", default: "200",
                      help: "HTTP multicast rows of 1000 tokens each sent after the runs (0: none)") { settings, text throws(ConfigurationError) in
            guard let number = Int(text), number >= 0 else { throw ConfigurationError("--multicast-rows takes a whole number") }
            settings.multicastRows = number
        },
        CommandOption("--statement-rows", placeholder: "N", default: "100000",
                      help: "rows taken through the outbox's statements alone, without sending, and through the least any "
                          + "design keeping each row's status could cost, after the runs (0: none)") { settings, text throws(ConfigurationError) in
            guard let number = Int(text), number >= 0 else { throw ConfigurationError("--statement-rows takes a whole number") }
            settings.statementRows = number
        },
        databaseURL,
    ], finish: requireDatabase)

    static let soakOptions = OptionTable<Settings>([
        CommandOption("--minutes", placeholder: "M", default: "30", help: "how long the load runs (fractions allowed)") { settings, text throws(ConfigurationError) in
            guard let minutes = Double(text), minutes > 0, minutes.isFinite else { throw ConfigurationError("--minutes takes a positive number") }
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
                throw ConfigurationError("--faults takes a list of drop, drain, nack, database")
            }
            settings.faults = faults.compactMap { $0 }
        },
        CommandOption("--ack-mode", placeholder: "MODE", default: "journal", help: "immediate, journal or durable") { settings, text throws(ConfigurationError) in
            guard let mode = CCSAckMode(rawValue: text) else { throw ConfigurationError("--ack-mode takes immediate, journal or durable") }
            settings.ackMode = mode
        },
        databaseURL,
    ], finish: requireDatabase)

    static let connectionsOptions = OptionTable<Settings>([
        positive("--idle", default: "10000", help: "idle TLS HTTP/2 connections held open to the ingress", \.idleConnections),
        positive("--posts", default: "2000", help: "posts of the one device measured alone and beside them", \.probePosts),
        databaseURL,
    ], finish: requireDatabase)

    static let devicesOptions = OptionTable<Settings>([
        positive("--connections", default: "64", help: "connections of the load, one request in flight on each", \.deviceConnections),
        positive("--seconds", default: "5", help: "length of each run", \.deviceSeconds),
        databaseURL,
    ], finish: requireDatabase)

    static let holdOptions = OptionTable<Settings>([
        positive("--port", default: "0", help: "the ingress's port on 127.0.0.1", \.holdPort),
        CommandOption("--ca-file", placeholder: "FILE", default: "none", help: "the CA its certificate comes from") { settings, text throws(ConfigurationError) in
            settings.holdCAFile = text
        },
        positive("--count", default: "10000", help: "connections to open and hold", \.idleConnections),
    ])

    @Sendable private static func requireDatabase(_ settings: inout Settings) throws(ConfigurationError) {
        guard !settings.databaseURL.isEmpty else {
            throw ConfigurationError("missing database URL: pass --database-url or set DATABASE_URL")
        }
    }

    static let command = WorkerCommand(
        name: "bench", synopsis: "upstream|downstream|soak|connections|devices [options]",
        summary: "measure throughput and latency through the simulator over TLS into PostgreSQL, and print the figures; "
            + "or soak: long mixed load with faults, failing on losses or growth; or connections: what idle devices cost; "
            + "or devices: device-shaped HTTP load (wrk, h2load) against the ingress and nginx",
        options: "bench upstream:\n\(upstreamOptions.help)\nbench downstream:\n\(downstreamOptions.help)\nbench soak:\n\(soakOptions.help)"
            + "\nbench connections:\n\(connectionsOptions.help)\nbench devices:\n\(devicesOptions.help)\nbench hold-connections (the helper process of bench connections):\n\(holdOptions.help)") { arguments, context in
            let modes = ["upstream", "downstream", "soak", "connections", "devices", "hold-connections"]
            guard let mode = arguments.first, modes.contains(mode) else {
                if arguments.first == "--help" || arguments.first == "-h" {
                    print(context.command?.help(program: context.program) ?? "", terminator: "")
                    return 0
                }
                return context.fail("bench: expected `bench upstream`, `bench downstream`, `bench soak` or `bench connections` (see \(context.program) help bench)")
            }
            var status: Int32 = 0
            let table = switch mode {
            case "upstream": upstreamOptions
            case "soak": soakOptions
            case "connections": connectionsOptions
            case "devices": devicesOptions
            case "hold-connections": holdOptions
            default: downstreamOptions
            }
            guard let (settings, positional) = context.parse(Array(arguments.dropFirst()), with: table,
                                                             into: Settings(), status: &status) else { return status }
            if let extra = positional.first { return context.fail("bench: unexpected argument \(extra)") }
            do {
                if mode == "hold-connections" {
                    try ConnectionsBench.hold(port: settings.holdPort, caFile: settings.holdCAFile, count: settings.idleConnections)
                } else if mode == "devices" {
                    try await DevicesBench(databaseURL: settings.databaseURL, connections: settings.deviceConnections,
                                           seconds: settings.deviceSeconds).run()
                } else if mode == "connections" {
                    try await ConnectionsBench(databaseURL: settings.databaseURL, idleConnections: settings.idleConnections,
                                               probePosts: settings.probePosts).run()
                } else if mode == "soak" {
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
                                            poolerURL: settings.poolerURL, source: settings.source, h2load: settings.h2load,
                                            httpsBatch: min(settings.httpsBatch, 100)).run()
                }
                return 0
            } catch {
                return context.fail("bench: \(error)", status: 1)
            }
        }
}
