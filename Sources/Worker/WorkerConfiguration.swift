import FCM
import Foundation
import Ingress
import Outbox
import Postgres
import Runtime
import Upstream
import Transport
import XMPP

/// Everything `fcm-worker run` needs, filled from flags, then environment, then defaults
/// (`options`, the one table of the run settings). Each setting is stored once: what code
/// sets is what runs.
///
/// `description` never shows the server key or the database password.
public struct WorkerConfiguration: Sendable, CustomStringConvertible {
    public var senderID: String
    public var serverKey: String
    /// CCS's TCP host and port (`--endpoint host:port`).
    public var host = "fcm-xmpp.googleapis.com"
    public var port = 5235
    /// The XMPP domain the stream and SASL identity use: not derived from the host.
    public var xmppDomain = "gcm.googleapis.com"
    /// PEM CA bundle to trust instead of the system store.
    public var caFile: String?
    public var databaseURL: String?
    /// How many CCS connections to keep open.
    public var connections = 1
    /// The handlers to run, by name (nil: the executable's default).
    public var handlers: [String]?
    /// Ping CCS after this much silence, and give up this long after the ping.
    public var pingInterval: Duration = .seconds(60)
    public var pingTimeout: Duration = .seconds(15)
    /// When upstream messages are acked (`CCSAckMode`).
    public typealias AckMode = CCSAckMode
    public var ackMode = CCSAckMode.immediate
    /// Where acked-but-unpersisted messages go when the database is down at shutdown.
    public var spoolFile = "fcm-worker.spool"
    /// Apply pending migrations at start instead of refusing to start.
    public var migrate = false
    /// A folder of the application's own `NNNN_name.sql` migrations (`--migrations-dir`),
    /// applied after the worker's and recorded as the set `app`; nil for none. Its absence
    /// is a configuration error, never a reason to start without it.
    public var migrationsDirectory: String?
    /// The application's migration sets registered in code (`WorkerMain.run(migrations:)`),
    /// applied after the worker's own, in this order.
    public var migrationSets: [MigrationSet] = []
    /// How long shutdown waits for queued messages to commit before spooling them.
    public var shutdownTimeout: Duration = .seconds(10)
    /// Batching and retry tuning of the upstream pipeline.
    public var pipeline = PipelineSettings()
    /// Reconnect delays: full jitter from `reconnectBase` doubling to `reconnectCap`.
    public var reconnectBase: Duration = .seconds(1)
    public var reconnectCap: Duration = .seconds(60)
    /// FCM's legacy HTTP endpoint (`--http-endpoint`), for rows with transport `http`.
    public var httpEndpoint = "fcm.googleapis.com:443"
    /// A Google service-account key file (`--service-account-file`, or
    /// `GOOGLE_APPLICATION_CREDENTIALS` as Google's tools read it): with one, rows with
    /// transport `v1` are sent with FCM's HTTP v1 API; without, they wait.
    public var serviceAccountFile: String?
    /// FCM's HTTP v1 endpoint (`--v1-endpoint`).
    public var v1Endpoint = "fcm.googleapis.com:443"
    /// The Firebase project v1 messages are sent for (`--project-id`; the service account's
    /// by default).
    public var projectID: String?
    /// HTTP/2 connections to the v1 endpoint (`--v1-connections`), each with up to 100
    /// concurrent streams (fewer if the server says so).
    public var v1Connections = 2
    /// How the outbox is sent: lease, sweep, retry policy.
    public var downstream = DownstreamSettings()
    /// The nice value of each connection's thread (`--io-niceness`, nil: leave it). The
    /// default -10 keeps reading and acking ahead of handler and database work when the
    /// cores are busy; without root or `CAP_SYS_NICE` the threads keep the default
    /// priority and the worker says so once at start.
    public var ioNiceness: Int32? = -10
    /// How long one database call may wait for the server before its connection is
    /// cancelled, dropped and replaced (`--database-timeout`), and how long connecting may take.
    public var databaseTimeout: Duration = .seconds(15)
    public var databaseConnectTimeout: Duration = .seconds(5)
    /// Prepare each SQL text once per database connection (`--prepared-statements`); off
    /// behind PgBouncer in transaction mode before 1.21, which loses them between transactions.
    public var preparedStatements = true
    /// What sits between the worker and PostgreSQL (`--database-pooler`).
    public var databasePooler = DatabasePooler.none
    /// A connection straight to PostgreSQL for what a transaction pooler cannot carry:
    /// the outbox's LISTEN and migrations (`--database-direct-url`).
    public var databaseDirectURL: String?
    /// The least severe level logged (`--log-level`), and the form of the lines (`--log-format`).
    public var logLevel = Logger.Level.info
    public var logFormat = Logger.Format.text
    /// Where `/metrics`, `/healthz` and `/readyz` are served (`--metrics-address`); nil: nowhere.
    public var metricsAddress: String?
    /// The HTTPS ingress's settings (`--ingress-*`); it runs when `address` is set.
    public var ingressSettings = IngressSettings(address: "")
    /// The HTTPS ingress, when `--ingress-address` is given.
    public var ingress: IngressSettings? { ingressSettings.address.isEmpty ? nil : ingressSettings }
    /// What parsing found worth saying but not refusing (a key file others can read), for
    /// the log at start.
    public internal(set) var warnings: [String] = []

    /// `--ingress-clock-skew` in whole seconds.
    public var ingressClockSkewSeconds: Int {
        get { Int(ingressSettings.clockSkew.components.seconds) }
        set { ingressSettings.clockSkew = .seconds(newValue) }
    }

    /// Lanes handling upstream messages in parallel (a device's messages keep one lane):
    /// the pipeline's partitions.
    public var concurrency: Int {
        get { pipeline.partitions }
        set { pipeline.partitions = newValue }
    }

    /// Handling attempts before a failing message is dead-lettered: the pipeline's.
    public var maxAttempts: Int {
        get { pipeline.maxAttempts }
        set { pipeline.maxAttempts = newValue }
    }

    public init(senderID: String, serverKey: String) {
        self.senderID = senderID
        self.serverKey = serverKey
    }

    /// Parses `arguments` (options only) over `environment`.
    /// - Throws: `ConfigurationError` naming the first missing or invalid setting (also for
    ///   `--help`, which callers handle before: see `options`).
    public static func parse(arguments: [String], environment: [String: String]) throws(ConfigurationError) -> WorkerConfiguration {
        switch try options.parse(arguments, environment: environment, into: WorkerConfiguration(senderID: "", serverKey: "")) {
        case .parsed(let configuration, let positional):
            if let extra = positional.first { throw ConfigurationError("unexpected argument \(extra) (see --help)") }
            return configuration
        case .helpRequested:
            throw ConfigurationError("--help lists the options")
        }
    }

    /// The settings of `fcm-worker run`, in the order `--help` lists them.
    public static let options = OptionTable<WorkerConfiguration>([
        CommandOption("--sender-id", environment: "FCM_SENDER_ID", placeholder: "ID", default: "required (with CCS)",
                      help: "FCM sender ID (letters, digits, - and _)") { settings, text throws(ConfigurationError) in
            guard text.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == "_") }) else {
                throw ConfigurationError("invalid sender ID: only letters, digits, - and _ are allowed")
            }
            settings.senderID = text
        },
        // Before --server-key: of the two given the same way (both flags, or both variables),
        // the key applies last and wins.
        CommandOption("--server-key-file", environment: "FCM_SERVER_KEY_FILE", placeholder: "PATH", default: "none",
                      help: "file holding the server key (one line; not readable by group or others)") { settings, path throws(ConfigurationError) in
            guard let contents = try? String(contentsOfFile: path, encoding: .utf8) else {
                throw ConfigurationError("cannot read the server key file \(path)")
            }
            settings.serverKey = try serverKey(contents, from: "the server key file \(path)")
            warnIfShared(path, holding: "the server key file", in: &settings)
        },
        CommandOption("--server-key", environment: "FCM_SERVER_KEY", placeholder: "KEY", default: "required with CCS (or a key file)",
                      help: "FCM server key; wins over a key file given the same way (flags win over variables); without one, rows with transport http wait") { settings, text throws(ConfigurationError) in
            settings.serverKey = try serverKey(text, from: "the server key")
        },
        CommandOption("--endpoint", environment: "FCM_ENDPOINT", placeholder: "HOST:PORT", default: "fcm-xmpp.googleapis.com:5235",
                      help: "CCS's address (5236 for FCM's testing service)") { settings, text throws(ConfigurationError) in
            (settings.host, settings.port) = try parseEndpoint(text)
        },
        CommandOption("--xmpp-domain", environment: "FCM_XMPP_DOMAIN", placeholder: "DOMAIN", default: "gcm.googleapis.com",
                      help: "the XMPP domain of the stream and the SASL identity") { settings, text throws(ConfigurationError) in
            guard !text.contains(where: { $0.isWhitespace || $0 == "/" || $0 == "@" }) else {
                throw ConfigurationError("invalid XMPP domain \(text)")
            }
            settings.xmppDomain = text
        },
        CommandOption("--ca-file", environment: "FCM_CA_FILE", placeholder: "PATH", default: "the system trust store",
                      help: "PEM certificate authorities to trust for CCS and HTTP") { settings, path throws(ConfigurationError) in
            do throws(TransportError) {
                try TLSTrust.checkCAFile(path)
            } catch {
                if case .certificateRejected(let reason) = error { throw ConfigurationError(reason) }
                throw ConfigurationError("the CA file \(path) cannot be used: \(error)")
            }
            settings.caFile = path
        },
        // Before --database-url: of the two given the same way, the URL applies last and wins.
        CommandOption("--database-url-file", environment: "FCM_DATABASE_URL_FILE", placeholder: "PATH", default: "none",
                      help: "file holding the database URL (one line): keeps its password out of ps and the environment") { settings, path throws(ConfigurationError) in
            settings.databaseURL = try readDatabaseURL(from: path, what: "the database URL file", into: &settings)
        },
        CommandOption("--database-url", environment: "DATABASE_URL", placeholder: "URL", default: "required",
                      help: "PostgreSQL URL or key=value connection string") { settings, text throws(ConfigurationError) in
            settings.databaseURL = try checkDatabaseURL(text)
        },
        CommandOption("--database-pooler", environment: "FCM_DATABASE_POOLER", placeholder: "none|transaction", default: "none",
                      help: "transaction: the database URL is a pooler in transaction mode (PgBouncer): no prepared statements, LISTEN and migrations over --database-direct-url") { settings, text throws(ConfigurationError) in
            guard let pooler = DatabasePooler(rawValue: text.lowercased()) else {
                throw ConfigurationError("invalid database pooler \(text): expected none or transaction")
            }
            settings.databasePooler = pooler
        },
        CommandOption("--database-direct-url-file", environment: "FCM_DATABASE_DIRECT_URL_FILE", placeholder: "PATH", default: "none",
                      help: "file holding the direct database URL (one line)") { settings, path throws(ConfigurationError) in
            settings.databaseDirectURL = try readDatabaseURL(from: path, what: "the direct database URL file", into: &settings)
        },
        CommandOption("--database-direct-url", environment: "FCM_DATABASE_DIRECT_URL", placeholder: "URL", default: "none",
                      help: "PostgreSQL itself, not the pooler: the outbox's LISTEN and migrations (without it behind a transaction pooler, new outbox rows wait for the 1 s sweep and migrate is refused)") { settings, text throws(ConfigurationError) in
            settings.databaseDirectURL = try checkDatabaseURL(text)
        },
        .seconds("--database-timeout", environment: "FCM_DATABASE_TIMEOUT", default: "15",
                 help: "a database call that waits this long has its connection dropped and replaced, and is retried (at least 0.1)",
                 name: "database timeout", minimum: .milliseconds(100), \.databaseTimeout),
        .integer("--connections", environment: "FCM_CONNECTIONS", default: "1",
                 help: "CCS connections to keep open (0 to 1000; 0: no CCS, the HTTPS ingress is the only source)",
                 name: "connection count", range: 0...1000, \.connections),
        CommandOption("--handlers", environment: "FCM_HANDLERS", placeholder: "a,b", default: "every registered handler",
                      help: "handlers to run, by name") { settings, text throws(ConfigurationError) in
            let names = text.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
            guard !names.isEmpty else { throw ConfigurationError("--handlers names no handler") }
            settings.handlers = names
        },
        CommandOption("--ack-mode", environment: "FCM_ACK_MODE", placeholder: "MODE", default: "immediate",
                      help: "immediate (ack on arrival), journal (ack once flushed to a local journal: survives kill -9) or durable (ack after the commit)") { settings, text throws(ConfigurationError) in
            guard let mode = CCSAckMode(rawValue: text) else {
                throw ConfigurationError("invalid ack mode \(text): expected \(CCSAckMode.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            settings.ackMode = mode
        },
        .integer("--concurrency", environment: "FCM_CONCURRENCY", default: "4",
                 help: "handling lanes (a device's messages keep one lane; 1 to 64)", name: "concurrency", range: 1...64, \.concurrency),
        .integer("--max-attempts", environment: "FCM_MAX_ATTEMPTS", default: "5",
                 help: "handling attempts before a message is dead-lettered (1 to 100)", name: "max attempts", range: 1...100, \.maxAttempts),
        .text("--spool-file", environment: "FCM_SPOOL_FILE", placeholder: "PATH", default: "./fcm-worker.spool",
              help: "where acked messages that could not be committed at shutdown wait for the next start (journal mode keeps its journal beside it, PATH.journal-N)", \.spoolFile),
        .seconds("--shutdown-timeout", environment: "FCM_SHUTDOWN_TIMEOUT", default: "10",
                 help: "how long a shutdown lets queued messages commit before spooling them", name: "shutdown timeout", \.shutdownTimeout),
        CommandOption("--migrations-dir", environment: "FCM_MIGRATIONS_DIR", placeholder: "PATH", default: "none",
                      help: "a folder of the application's NNNN_name.sql migrations, applied after the worker's own (compiled in) as the set app") { settings, path throws(ConfigurationError) in
            settings.migrationsDirectory = path
        },
        .toggle("--migrate", environment: "FCM_MIGRATE", help: "apply pending migrations at start instead of refusing to start") { settings, on in
            settings.migrate = on
        },
        .seconds("--ping-interval", environment: "FCM_PING_INTERVAL", default: "60", help: "ping CCS after this much silence (at least 1)",
                 name: "ping interval", minimum: .seconds(1), \.pingInterval),
        .seconds("--ping-timeout", environment: "FCM_PING_TIMEOUT", default: "15",
                 help: "a connection silent this long after a ping is dropped and replaced (at least 1)", name: "ping timeout",
                 minimum: .seconds(1), \.pingTimeout),
        CommandOption("--outbox-lease", environment: "FCM_OUTBOX_LEASE", placeholder: "SECONDS", default: "60",
                      help: "claim on an outbox row before another worker may take it over") { settings, text throws(ConfigurationError) in
            settings.downstream.lease = try CommandOption<WorkerConfiguration>.parseSeconds(text, name: "outbox lease")
            guard settings.downstream.lease >= .seconds(1) else {
                throw ConfigurationError("invalid outbox lease \(text): expected at least 1 second")
            }
        },
        .seconds("--retry-base", environment: "FCM_RETRY_BASE", default: "1", help: "first wait before a downstream message is sent again",
                 name: "retry base", \.downstream.retry.base),
        .seconds("--retry-max-age", environment: "FCM_RETRY_MAX_AGE", default: "86400", help: "no downstream retry after this age",
                 name: "retry maximum age", \.downstream.retry.maximumAge),
        CommandOption("--worker-id", environment: "FCM_WORKER_ID", placeholder: "ID", default: "host:pid:random",
                      help: "written to claimed_by on outbox rows") { settings, text throws(ConfigurationError) in
            guard text.count <= 200, !text.contains(where: { $0.isNewline }) else {
                throw ConfigurationError("invalid worker ID: at most 200 characters on one line")
            }
            settings.downstream.workerID = text
        },
        httpsEndpoint("--http-endpoint", environment: "FCM_HTTP_ENDPOINT", name: "HTTP endpoint",
                      help: "FCM's legacy HTTP API (multicast, device groups, rows with transport http)", \.httpEndpoint),
        CommandOption("--service-account-file", environment: "GOOGLE_APPLICATION_CREDENTIALS", placeholder: "PATH", default: "none",
                      help: "a Google service-account key file (JSON): sends rows with transport v1 through FCM's HTTP v1 API; "
                        + "an unusable file or a refused grant stops the start with status 3") { settings, path throws(ConfigurationError) in
            guard !path.isEmpty else { throw ConfigurationError("--service-account-file names no file") }
            settings.serviceAccountFile = path
            warnIfShared(path, holding: "the service-account file", in: &settings)
        },
        httpsEndpoint("--v1-endpoint", environment: "FCM_V1_ENDPOINT", name: "v1 endpoint", help: "FCM's HTTP v1 API (rows with transport v1)",
                      \.v1Endpoint),
        CommandOption("--project-id", environment: "FCM_PROJECT_ID", placeholder: "ID", default: "the service account's",
                      help: "the Firebase project v1 messages are sent for") { settings, text throws(ConfigurationError) in
            guard !text.isEmpty, text.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-") }) else {
                throw ConfigurationError("invalid project ID \(text): letters, digits and - only")
            }
            settings.projectID = text
        },
        .integer("--v1-connections", environment: "FCM_V1_CONNECTIONS", default: "2",
                 help: "HTTP/2 connections to the v1 endpoint, up to 100 streams each (1 to 64)", name: "v1 connection count",
                 range: 1...64, \.v1Connections),
        CommandOption("--io-niceness", environment: "FCM_IO_NICENESS", placeholder: "N|off", default: "-10",
                      help: "nice value of the connection threads, -20 to 19 (below 0 needs root or CAP_SYS_NICE): acks ahead of database work") { settings, text throws(ConfigurationError) in
            if text == "off" {
                settings.ioNiceness = nil
            } else {
                settings.ioNiceness = Int32(try CommandOption<WorkerConfiguration>.parseInteger(text, name: "I/O niceness", range: -20...19,
                                                                                               expecting: "-20 to 19, or off"))
            }
        },
        CommandOption("--prepared-statements", environment: "FCM_PREPARED_STATEMENTS", placeholder: "on|off", default: "on",
                      help: "prepare each SQL text once per connection (never with --database-pooler transaction)") { settings, text throws(ConfigurationError) in
            switch text.lowercased() {
            case "on", "1", "true", "yes": settings.preparedStatements = true
            case "off", "0", "false", "no": settings.preparedStatements = false
            default: throw ConfigurationError("invalid prepared statements setting \(text): expected on or off")
            }
        },
        CommandOption("--log-level", environment: "FCM_LOG_LEVEL", placeholder: "LEVEL", default: "info",
                      help: "least severe level logged: trace, debug, info, notice, warning, error or critical") { settings, text throws(ConfigurationError) in
            guard let level = Logger.Level(name: text) else {
                throw ConfigurationError("invalid log level \(text): expected \(Logger.Level.allCases.map(\.description).joined(separator: ", "))")
            }
            settings.logLevel = level
        },
        CommandOption("--log-format", environment: "FCM_LOG_FORMAT", placeholder: "FORMAT", default: "text",
                      help: "text (one line per entry) or json (one object per line)") { settings, text throws(ConfigurationError) in
            guard let format = Logger.Format(rawValue: text.lowercased()) else {
                throw ConfigurationError("invalid log format \(text): expected text or json")
            }
            settings.logFormat = format
        },
        CommandOption("--ingress-address", environment: "FCM_INGRESS_ADDRESS", placeholder: "HOST:PORT", default: "off",
                      help: "serve the HTTPS ingress (devices post upstream messages: docs/ingress.md) on this address") { settings, text throws(ConfigurationError) in
            settings.ingressSettings.address = text
        },
        CommandOption("--ingress-tls-cert", environment: "FCM_INGRESS_TLS_CERT", placeholder: "PATH", default: "none",
                      help: "the ingress's PEM certificate chain (reloaded on SIGHUP)") { settings, path throws(ConfigurationError) in
            settings.ingressSettings.certificateFile = path
        },
        CommandOption("--ingress-tls-key", environment: "FCM_INGRESS_TLS_KEY", placeholder: "PATH", default: "none",
                      help: "the ingress's PEM private key (reloaded on SIGHUP)") { settings, path throws(ConfigurationError) in
            settings.ingressSettings.keyFile = path
        },
        .toggle("--ingress-plain", environment: "FCM_INGRESS_PLAIN",
                help: "serve the ingress without TLS (HTTP/1.1 and h2c), behind a TLS-terminating load balancer") { settings, on in
            settings.ingressSettings.plain = on
        },
        CommandOption("--ingress-auth", environment: "FCM_INGRESS_AUTH", placeholder: "KIND", default: "id-token",
                      help: "tokens a device presents: id-token, app-check, both or none") { settings, text throws(ConfigurationError) in
            guard let kind = IngressSettings.Authentication(rawValue: text.lowercased()) else {
                throw ConfigurationError("invalid ingress auth \(text): expected id-token, app-check, both or none")
            }
            settings.ingressSettings.authentication = kind
        },
        .toggle("--ingress-allow-unauthenticated", environment: "FCM_INGRESS_ALLOW_UNAUTHENTICATED",
                help: "allow --ingress-auth none on an address that is not loopback (a proxy in front authenticates)") { settings, on in
            settings.ingressSettings.allowUnauthenticated = on
        },
        CommandOption("--ingress-project-id", environment: "FCM_INGRESS_PROJECT_ID", placeholder: "ID", default: "--project-id",
                      help: "the Firebase project tokens must be issued for") { settings, text throws(ConfigurationError) in
            settings.ingressSettings.projectID = text
        },
        CommandOption("--ingress-project-number", environment: "FCM_INGRESS_PROJECT_NUMBER", placeholder: "N", default: "not checked",
                      help: "the project's number: App Check tokens must name it in iss") { settings, text throws(ConfigurationError) in
            guard !text.isEmpty, text.allSatisfy(\.isNumber) else { throw ConfigurationError("invalid project number \(text): digits only") }
            settings.ingressSettings.projectNumber = text
        },
        CommandOption("--ingress-id-token-keys-url", environment: "FCM_INGRESS_ID_TOKEN_KEYS_URL", placeholder: "URL", default: "Google's",
                      help: "where Firebase Auth's signing certificates are published") { settings, text throws(ConfigurationError) in
            settings.ingressSettings.idTokenKeysURL = text
        },
        CommandOption("--ingress-app-check-keys-url", environment: "FCM_INGRESS_APP_CHECK_KEYS_URL", placeholder: "URL", default: "Google's",
                      help: "where App Check's JWK set is published") { settings, text throws(ConfigurationError) in
            settings.ingressSettings.appCheckKeysURL = text
        },
        CommandOption("--ingress-rate", environment: "FCM_INGRESS_RATE", placeholder: "N", default: "10",
                      help: "messages per second one sender may post, after its burst") { settings, text throws(ConfigurationError) in
            guard let rate = Double(text), rate > 0, rate <= 1_000_000 else { throw ConfigurationError("invalid ingress rate \(text): expected a number above 0") }
            settings.ingressSettings.ratePerSecond = rate
        },
        .integer("--ingress-burst", environment: "FCM_INGRESS_BURST", default: "20",
                 help: "messages one sender may post at once (FCM let a device queue 20)", name: "ingress burst", range: 1...100_000,
                 \.ingressSettings.rateBurst),
        .integer("--ingress-max-connections", environment: "FCM_INGRESS_MAX_CONNECTIONS", default: "4096",
                 help: "connections the ingress serves at once", name: "ingress connection limit", range: 1...1_000_000,
                 \.ingressSettings.maximumConnections),
        .seconds("--ingress-idle-timeout", environment: "FCM_INGRESS_IDLE_TIMEOUT", default: "60",
                 help: "close an ingress connection idle this long", name: "ingress idle timeout", \.ingressSettings.idleTimeout),
        .seconds("--ingress-request-timeout", environment: "FCM_INGRESS_REQUEST_TIMEOUT", default: "10",
                 help: "a request begun must arrive whole within this (else 408)", name: "ingress request timeout", \.ingressSettings.requestTimeout),
        .seconds("--ingress-queue-wait", environment: "FCM_INGRESS_QUEUE_WAIT", default: "2",
                 help: "how long a request waits for room in full lanes before 503 (0: at once)", name: "ingress queue wait",
                 \.ingressSettings.queueWait),
        .integer("--ingress-clock-skew", environment: "FCM_INGRESS_CLOCK_SKEW", default: "10",
                 help: "seconds a token's times may be off (0 to 60)", name: "ingress clock skew", range: 0...60, \.ingressClockSkewSeconds),
        CommandOption("--metrics-address", environment: "FCM_METRICS_ADDRESS", placeholder: "HOST:PORT", default: "off",
                      help: "serve /metrics (Prometheus), /healthz and /readyz over HTTP on this address") { settings, text throws(ConfigurationError) in
            guard let colon = text.lastIndex(of: ":"), let port = Int(text[text.index(after: colon)...]), (0...65535).contains(port),
                  colon > text.startIndex else {
                throw ConfigurationError("invalid metrics address \(text): expected host:port, such as 127.0.0.1:9464")
            }
            settings.metricsAddress = text
        },
    ]) { settings throws(ConfigurationError) in
        if !settings.ingressSettings.address.isEmpty {
            if settings.ingressSettings.projectID == nil { settings.ingressSettings.projectID = settings.projectID }
            if let problem = settings.ingressSettings.problem { throw ConfigurationError(problem) }
        }
        if settings.connections == 0 {
            // Without CCS the credentials are optional: without a server key, rows with
            // transport http wait for a worker that has one (as v1 rows do without a
            // service account).
            guard !settings.ingressSettings.address.isEmpty else {
                throw ConfigurationError("--connections 0 leaves the worker nothing to receive: serve the HTTPS ingress (--ingress-address)")
            }
            return
        }
        guard !settings.senderID.isEmpty else {
            throw ConfigurationError("missing sender ID: pass --sender-id or set FCM_SENDER_ID")
        }
        guard !settings.serverKey.isEmpty else {
            throw ConfigurationError("missing server key: pass --server-key or --server-key-file, or set FCM_SERVER_KEY or FCM_SERVER_KEY_FILE")
        }
    }

    /// An HTTPS endpoint setting: `host:port`, `[v6]:port` or a bare host (port 443).
    static func httpsEndpoint(_ flag: String, environment: String, name: String, help: String,
                              _ keyPath: any WritableKeyPath<WorkerConfiguration, String> & Sendable) -> CommandOption<WorkerConfiguration> {
        CommandOption(flag, environment: environment, placeholder: "HOST:PORT", default: "fcm.googleapis.com:443", help: help) { settings, text throws(ConfigurationError) in
            var probe = FCMHTTPClient.Settings(serverKey: "", senderID: "")
            do {
                try probe.setEndpoint(text)
            } catch {
                throw ConfigurationError("invalid \(name) \(text): expected host:port")
            }
            settings[keyPath: keyPath] = text
        }
    }

    /// Warnings for secrets given as flags, which every user of the host can read in `ps`
    /// (and which stay in shell histories): the server key, and a database URL holding a
    /// password. Each names the safe way to give it.
    public static func secretsInArguments(_ arguments: [String]) -> [String] {
        var warnings: [String] = []
        for (index, argument) in arguments.enumerated() {
            let (flag, inline) = argument.firstIndex(of: "=").map { (String(argument[..<$0]), String(argument[argument.index(after: $0)...])) }
                ?? (argument, nil)
            let value = inline ?? (index + 1 < arguments.count ? arguments[index + 1] : "")
            switch flag {
            case "--server-key":
                warnings.append("the server key was given as --server-key, which any user of this host can read in ps: "
                                + "use --server-key-file or FCM_SERVER_KEY")
            case "--database-url", "--database-direct-url":
                if value.contains("*") == false, PostgresConnection.redactingPasswords(value).contains("***") {
                    warnings.append("\(flag) holds a password, which any user of this host can read in ps: "
                                    + "use --database-url-file, DATABASE_URL or a ~/.pgpass file")
                }
            default:
                break
            }
        }
        return warnings
    }

    /// Warns (at start) when a file holding a secret can be read by group or others.
    static func warnIfShared(_ path: String, holding what: String, in settings: inout WorkerConfiguration) {
        guard let attributes = try? FileManager.default.attributesOfItem(atPath: path),
              let permissions = attributes[.posixPermissions] as? Int, permissions & 0o077 != 0 else { return }
        settings.warnings.append("\(what) \(path) can be read by group or others (mode \(String(permissions, radix: 8))): chmod 600 it")
    }

    /// A server key as given or read from a file: surrounding white space is dropped; a
    /// line break inside it (a key file of several lines) is refused.
    static func serverKey(_ text: String, from source: String) throws(ConfigurationError) -> String {
        let key = text.trimmingCharacters(in: .whitespacesAndNewlines)
        guard !key.isEmpty else { throw ConfigurationError("\(source) is empty") }
        guard !key.contains(where: { $0 == "\n" || $0 == "\r" }) else {
            throw ConfigurationError("\(source) holds more than one line: a server key is one line")
        }
        return key
    }

    /// `host:port`, `[v6]:port`, or a bare host (port 5235).
    /// `text` if it is a connection string libpq can use.
    private static func checkDatabaseURL(_ text: String) throws(ConfigurationError) -> String {
        do throws(PostgresError) {
            _ = try PostgresConnectionString(text)
        } catch {
            throw ConfigurationError(error.message)
        }
        return text
    }

    /// The one-line connection string in the file at `path` (warning when others may read it).
    private static func readDatabaseURL(from path: String, what: String,
                                        into settings: inout WorkerConfiguration) throws(ConfigurationError) -> String {
        guard let contents = try? String(contentsOfFile: path, encoding: .utf8) else {
            throw ConfigurationError("cannot read \(what) \(path)")
        }
        let url = contents.trimmingCharacters(in: .whitespacesAndNewlines)
        guard !url.isEmpty, !url.contains(where: { $0 == "\n" || $0 == "\r" }) else {
            throw ConfigurationError("\(what) \(path) must hold one line")
        }
        do throws(PostgresError) {
            _ = try PostgresConnectionString(url)
        } catch {
            throw ConfigurationError("\(what) \(path): \(error.message)")
        }
        warnIfShared(path, holding: what, in: &settings)
        return url
    }

    /// Whether database connections prepare statements: never through a transaction pooler.
    public var preparesStatements: Bool { preparedStatements && databasePooler == .none }

    /// Where sessions go (the outbox's LISTEN, migrations' lock): the direct URL, else the
    /// database URL unless that is a transaction pooler (nil then).
    public var sessionDatabaseURL: String? {
        databaseDirectURL ?? (databasePooler == .transaction ? nil : databaseURL)
    }

    static func parseEndpoint(_ text: String) throws(ConfigurationError) -> (String, Int) {
        var host = text, portText: String?
        if text.hasPrefix("["), let close = text.firstIndex(of: "]") {
            host = String(text[text.index(after: text.startIndex)..<close])
            let rest = text[text.index(after: close)...]
            if rest.hasPrefix(":") { portText = String(rest.dropFirst()) } else if !rest.isEmpty {
                throw ConfigurationError("invalid endpoint \(text): expected [host]:port")
            }
        } else if let colon = text.lastIndex(of: ":"), text.firstIndex(of: ":") == colon {
            host = String(text[..<colon])
            portText = String(text[text.index(after: colon)...])
        }
        guard !host.isEmpty, !host.contains(where: { $0.isWhitespace || $0 == "/" }) else {
            throw ConfigurationError("invalid endpoint \(text): expected host:port")
        }
        guard let portText else { return (host, 5235) }
        guard let port = Int(portText), (1...65535).contains(port) else {
            throw ConfigurationError("invalid endpoint port in \(text): expected 1 to 65535")
        }
        return (host, port)
    }

    /// The migrations this configuration runs with: the worker's own, then the sets
    /// registered in code, then the `--migrations-dir` folder as the set `app`.
    /// - Throws: `ConfigurationError` for a folder that does not exist or holds a badly
    ///   named file, or two sets with one name.
    public func migrator() throws(ConfigurationError) -> Migrator {
        var sets = [MigrationSet.worker] + migrationSets
        if let migrationsDirectory {
            do throws(MigrationError) {
                sets.append(try MigrationSet.directory(migrationsDirectory, name: "app"))
            } catch {
                throw ConfigurationError(error.description)
            }
        }
        var names = Set<String>()
        if let twice = sets.first(where: { !names.insert($0.name).inserted }) {
            throw ConfigurationError("two migration sets are named \(twice.name)")
        }
        return Migrator(sets: sets)
    }

    /// The settings of the legacy HTTP client (same credentials and trust as XMPP).
    public var httpClient: FCMHTTPClient.Settings {
        var settings = FCMHTTPClient.Settings(serverKey: serverKey, senderID: senderID)
        try? settings.setEndpoint(httpEndpoint)
        settings.trust = caFile.map { .caFile($0) } ?? .systemDefault
        return settings
    }

    /// The transports a worker with these settings sends: `xmpp` with CCS connections,
    /// `http` with a server key, `v1` with a service account. Rows of the others wait for
    /// a worker that can send them.
    public var sendableTransports: Set<String> {
        Set((connections > 0 ? ["xmpp"] : []) + (serverKey.isEmpty ? [] : ["http"]) + (serviceAccountFile == nil ? [] : ["v1"]))
    }

    /// The settings of the v1 client (the same trust as XMPP and HTTP).
    public var v1Client: FCMV1Client.Settings {
        var settings = FCMV1Client.Settings()
        var endpoint = FCMHTTPClient.Settings(serverKey: "", senderID: "")
        try? endpoint.setEndpoint(v1Endpoint)
        (settings.host, settings.port) = (endpoint.host, endpoint.port)
        settings.trust = caFile.map { .caFile($0) } ?? .systemDefault
        settings.projectID = projectID
        settings.maximumConnections = v1Connections
        settings.clientName = "fcm-worker/\(WorkerMain.version)"
        return settings
    }

    /// The XMPP settings of one CCS connection.
    public var xmppClient: XMPPClientConfiguration {
        var client = XMPPClientConfiguration(
            host: host, port: port,
            credentials: .init(domain: xmppDomain, authenticationIdentity: "\(senderID)@\(xmppDomain)", password: serverKey),
            trust: caFile.map { .caFile($0) } ?? .systemDefault)
        client.pingInterval = pingInterval
        client.pingTimeout = pingTimeout
        client.threadNiceness = ioNiceness
        return client
    }

    /// What the CCS client needs: the connections, their XMPP settings and reconnects.
    var ccsClient: CCSClientSettings {
        CCSClientSettings(client: xmppClient, connections: connections, ackMode: ackMode, reconnectBase: reconnectBase, reconnectCap: reconnectCap)
    }

    public var description: String {
        "sender \(senderID), endpoint \(host):\(port), domain \(xmppDomain), \(connections) connection(s), "
            + "trust \(caFile ?? "system store"), handlers \(handlers?.joined(separator: ",") ?? "all"), ack mode \(ackMode.rawValue), "
            + "concurrency \(concurrency), outbox lease \(downstream.lease.formattedSeconds) as \(downstream.workerID), "
            + "database \(databaseURL.map { (try? PostgresConnectionString($0))?.description ?? "(unparsable)" } ?? "none")"
            + (serviceAccountFile.map { ", v1 \(v1Endpoint) with \($0)" } ?? "")
    }
}
