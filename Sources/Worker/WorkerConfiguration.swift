import FCM
import Foundation
import Postgres
import XMPP
import Runtime

/// A setting that is missing or invalid. `fcm-worker` prints `description` as one line and
/// exits with status 2.
public struct ConfigurationError: Error, Equatable, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// Everything `fcm-worker run` needs, filled from flags, then environment, then defaults.
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
    /// Built-in handler names to run.
    public var handlers = ["store"]
    /// Ping CCS after this much silence, and give up this long after the ping.
    public var pingInterval: Duration = .seconds(60)
    public var pingTimeout: Duration = .seconds(15)
    /// When upstream messages are acked (`CCSAckMode`).
    public typealias AckMode = CCSAckMode
    public var ackMode = CCSAckMode.immediate
    /// Lanes handling upstream messages in parallel (a device's messages keep one lane).
    public var concurrency = 4
    /// Handling attempts before a failing message is dead-lettered.
    public var maxAttempts = 5
    /// Where acked-but-unpersisted messages go when the database is down at shutdown.
    public var spoolFile = "fcm-worker.spool"
    /// Apply pending migrations at start instead of refusing to start.
    public var migrate = false
    /// The folder of `NNNN_name.sql` migration files.
    public var migrationsDirectory = Migrator.defaultDirectory()
    /// How long shutdown waits for queued messages to commit before spooling them.
    public var shutdownTimeout: Duration = .seconds(10)
    /// Batching and retry tuning of the upstream pipeline (`concurrency` sets its lanes).
    public var pipeline = PipelineSettings()
    /// Reconnect delays: full jitter from `reconnectBase` doubling to `reconnectCap`.
    public var reconnectBase: Duration = .seconds(1)
    public var reconnectCap: Duration = .seconds(60)
    /// FCM's legacy HTTP endpoint (`--http-endpoint`), for rows with transport `http`.
    public var httpEndpoint = "fcm.googleapis.com:443"
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

    public init(senderID: String, serverKey: String) {
        self.senderID = senderID
        self.serverKey = serverKey
    }

    /// The configuration flags and their environment variables, for `--help`.
    public static let usage = """
        --sender-id ID            FCM_SENDER_ID         FCM sender ID (required)
        --server-key KEY          FCM_SERVER_KEY        FCM server key (required, or:)
        --server-key-file PATH    FCM_SERVER_KEY_FILE   file holding the server key
        --endpoint HOST:PORT      FCM_ENDPOINT          default fcm-xmpp.googleapis.com:5235
        --xmpp-domain DOMAIN      FCM_XMPP_DOMAIN       default gcm.googleapis.com
        --ca-file PATH            FCM_CA_FILE           PEM CAs to trust (default: system store)
        --database-url URL        DATABASE_URL          PostgreSQL URL or conninfo
        --connections N           FCM_CONNECTIONS       CCS connections to keep open (default 1)
        --handlers a,b            FCM_HANDLERS          handlers to run (default store)
        --ping-interval SECONDS   FCM_PING_INTERVAL     ping after this much silence (default 60)
        --ping-timeout SECONDS    FCM_PING_TIMEOUT      dead if no answer within (default 15)
        --ack-mode MODE           FCM_ACK_MODE          immediate (default) or durable
        --concurrency N           FCM_CONCURRENCY       parallel handling lanes (default 4)
        --max-attempts N          FCM_MAX_ATTEMPTS      tries before dead-lettering (default 5)
        --spool-file PATH         FCM_SPOOL_FILE        default ./fcm-worker.spool
        --shutdown-timeout SECS   FCM_SHUTDOWN_TIMEOUT  drain time on SIGTERM (default 10)
        --migrations-dir PATH     FCM_MIGRATIONS_DIR    default ./migrations
        --migrate                 FCM_MIGRATE=1         apply pending migrations at start
        --outbox-lease SECS       FCM_OUTBOX_LEASE      claim on an outbox row before another
                                                        worker may take it over (default 60)
        --retry-base SECS         FCM_RETRY_BASE        first downstream retry wait (default 1)
        --retry-max-age SECS      FCM_RETRY_MAX_AGE     no retry after this age (default 86400)
        --worker-id ID            FCM_WORKER_ID         claimed_by on outbox rows (default host:pid:random)
        --http-endpoint HOST:PORT FCM_HTTP_ENDPOINT     legacy HTTP API (default fcm.googleapis.com:443)
        --io-niceness N|off       FCM_IO_NICENESS       nice value of connection threads, -20 to 19
                                                        (default -10: acks ahead of database work;
                                                        below 0 needs root or CAP_SYS_NICE)
        --database-timeout SECS   FCM_DATABASE_TIMEOUT  a database call waits this long before its
                                                        connection is dropped and replaced (default 15)
        --prepared-statements on|off FCM_PREPARED_STATEMENTS  prepare SQL once per connection
                                                        (default on; off behind PgBouncer's
                                                        transaction mode before 1.21)
      """

    private static let flags: [String: String] = [
        "--sender-id": "FCM_SENDER_ID", "--server-key": "FCM_SERVER_KEY", "--server-key-file": "FCM_SERVER_KEY_FILE",
        "--endpoint": "FCM_ENDPOINT", "--xmpp-domain": "FCM_XMPP_DOMAIN", "--ca-file": "FCM_CA_FILE",
        "--database-url": "DATABASE_URL", "--connections": "FCM_CONNECTIONS", "--handlers": "FCM_HANDLERS",
        "--ping-interval": "FCM_PING_INTERVAL", "--ping-timeout": "FCM_PING_TIMEOUT",
        "--ack-mode": "FCM_ACK_MODE", "--concurrency": "FCM_CONCURRENCY", "--max-attempts": "FCM_MAX_ATTEMPTS",
        "--spool-file": "FCM_SPOOL_FILE", "--shutdown-timeout": "FCM_SHUTDOWN_TIMEOUT",
        "--migrations-dir": "FCM_MIGRATIONS_DIR", "--migrate": "FCM_MIGRATE",
        "--outbox-lease": "FCM_OUTBOX_LEASE", "--retry-base": "FCM_RETRY_BASE", "--retry-max-age": "FCM_RETRY_MAX_AGE",
        "--worker-id": "FCM_WORKER_ID", "--http-endpoint": "FCM_HTTP_ENDPOINT", "--io-niceness": "FCM_IO_NICENESS",
        "--prepared-statements": "FCM_PREPARED_STATEMENTS", "--database-timeout": "FCM_DATABASE_TIMEOUT",
    ]
    /// Flags that take no value.
    private static let switches: Set<String> = ["--migrate"]

    /// Parses `arguments` (flags only, `--flag value` or `--flag=value`) over `environment`.
    /// - Throws: `ConfigurationError` naming the first missing or invalid setting.
    public static func parse(arguments: [String], environment: [String: String]) throws(ConfigurationError) -> WorkerConfiguration {
        var values: [String: String] = [:]
        var index = 0
        while index < arguments.count {
            let argument = arguments[index]
            var flag = argument, value: String?
            if let equals = argument.firstIndex(of: "="), argument.hasPrefix("--") {
                flag = String(argument[..<equals])
                value = String(argument[argument.index(after: equals)...])
            }
            guard let variable = flags[flag] else {
                throw ConfigurationError("unknown option \(flag) (see fcm-worker --help)")
            }
            if value == nil && switches.contains(flag) {
                value = "1"
            } else if value == nil {
                index += 1
                guard index < arguments.count else { throw ConfigurationError("\(flag) needs a value") }
                value = arguments[index]
            }
            values[variable] = value
            index += 1
        }
        func setting(_ variable: String) -> String? {
            let value = values[variable] ?? environment[variable]
            return value?.isEmpty == true ? nil : value
        }

        guard let senderID = setting("FCM_SENDER_ID") else {
            throw ConfigurationError("missing sender ID: pass --sender-id or set FCM_SENDER_ID")
        }
        guard senderID.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == "_") }) else {
            throw ConfigurationError("invalid sender ID: only letters, digits, - and _ are allowed")
        }
        let key: String
        if let inline = setting("FCM_SERVER_KEY") {
            key = inline
        } else if let path = setting("FCM_SERVER_KEY_FILE") {
            guard let contents = try? String(contentsOfFile: path, encoding: .utf8) else {
                throw ConfigurationError("cannot read the server key file \(path)")
            }
            key = contents.trimmingCharacters(in: .whitespacesAndNewlines)
            guard !key.isEmpty else { throw ConfigurationError("the server key file \(path) is empty") }
        } else {
            throw ConfigurationError("missing server key: pass --server-key or --server-key-file, or set FCM_SERVER_KEY or FCM_SERVER_KEY_FILE")
        }
        var configuration = WorkerConfiguration(senderID: senderID, serverKey: key)

        if let endpoint = setting("FCM_ENDPOINT") {
            (configuration.host, configuration.port) = try parseEndpoint(endpoint)
        }
        if let domain = setting("FCM_XMPP_DOMAIN") {
            guard !domain.contains(where: { $0.isWhitespace || $0 == "/" || $0 == "@" }) else {
                throw ConfigurationError("invalid XMPP domain \(domain)")
            }
            configuration.xmppDomain = domain
        }
        if let caFile = setting("FCM_CA_FILE") {
            guard FileManager.default.isReadableFile(atPath: caFile) else {
                throw ConfigurationError("the CA file \(caFile) does not exist or is not readable")
            }
            configuration.caFile = caFile
        }
        if let url = setting("DATABASE_URL") {
            do {
                _ = try PostgresConnectionString(url)
            } catch {
                throw ConfigurationError(error.message)
            }
            configuration.databaseURL = url
        }
        if let timeout = setting("FCM_DATABASE_TIMEOUT") {
            configuration.databaseTimeout = try parseSeconds(timeout, name: "database timeout")
        }
        if let connections = setting("FCM_CONNECTIONS") {
            guard let count = Int(connections), (1...1000).contains(count) else {
                throw ConfigurationError("invalid connection count \(connections): expected 1 to 1000")
            }
            configuration.connections = count
        }
        if let handlers = setting("FCM_HANDLERS") {
            let names = handlers.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
            guard !names.isEmpty else { throw ConfigurationError("--handlers names no handler") }
            configuration.handlers = names
        }
        if let interval = setting("FCM_PING_INTERVAL") {
            configuration.pingInterval = try parseSeconds(interval, name: "ping interval")
        }
        if let timeout = setting("FCM_PING_TIMEOUT") {
            configuration.pingTimeout = try parseSeconds(timeout, name: "ping timeout")
        }
        if let mode = setting("FCM_ACK_MODE") {
            guard let ackMode = AckMode(rawValue: mode) else {
                throw ConfigurationError("invalid ack mode \(mode): expected immediate or durable")
            }
            configuration.ackMode = ackMode
        }
        if let text = setting("FCM_CONCURRENCY") {
            guard let value = Int(text), (1...64).contains(value) else {
                throw ConfigurationError("invalid concurrency \(text): expected 1 to 64")
            }
            configuration.concurrency = value
        }
        configuration.pipeline.partitions = configuration.concurrency
        if let text = setting("FCM_MAX_ATTEMPTS") {
            guard let value = Int(text), (1...100).contains(value) else {
                throw ConfigurationError("invalid max attempts \(text): expected 1 to 100")
            }
            configuration.maxAttempts = value
        }
        configuration.pipeline.maxAttempts = configuration.maxAttempts
        if let path = setting("FCM_SPOOL_FILE") { configuration.spoolFile = path }
        if let timeout = setting("FCM_SHUTDOWN_TIMEOUT") {
            configuration.shutdownTimeout = try parseSeconds(timeout, name: "shutdown timeout")
        }
        if let directory = setting("FCM_MIGRATIONS_DIR") { configuration.migrationsDirectory = directory }
        if let migrate = setting("FCM_MIGRATE") {
            guard ["1", "true", "yes", "0", "false", "no"].contains(migrate.lowercased()) else {
                throw ConfigurationError("invalid FCM_MIGRATE \(migrate): expected 1 or 0")
            }
            configuration.migrate = ["1", "true", "yes"].contains(migrate.lowercased())
        }
        if let lease = setting("FCM_OUTBOX_LEASE") {
            configuration.downstream.lease = try parseSeconds(lease, name: "outbox lease")
            guard configuration.downstream.lease >= .seconds(1) else {
                throw ConfigurationError("invalid outbox lease \(lease): expected at least 1 second")
            }
        }
        if let base = setting("FCM_RETRY_BASE") {
            configuration.downstream.retry.base = try parseSeconds(base, name: "retry base")
        }
        if let age = setting("FCM_RETRY_MAX_AGE") {
            configuration.downstream.retry.maximumAge = try parseSeconds(age, name: "retry maximum age")
        }
        if let endpoint = setting("FCM_HTTP_ENDPOINT") {
            var probe = FCMHTTPClient.Settings(serverKey: "", senderID: "")
            do {
                try probe.setEndpoint(endpoint)
            } catch {
                throw ConfigurationError("invalid HTTP endpoint \(endpoint): expected host:port")
            }
            configuration.httpEndpoint = endpoint
        }
        if let workerID = setting("FCM_WORKER_ID") {
            guard workerID.count <= 200, !workerID.contains(where: { $0.isNewline }) else {
                throw ConfigurationError("invalid worker ID: at most 200 characters on one line")
            }
            configuration.downstream.workerID = workerID
        }
        if let niceness = setting("FCM_IO_NICENESS") {
            if niceness == "off" {
                configuration.ioNiceness = nil
            } else {
                guard let value = Int32(niceness), (-20...19).contains(value) else {
                    throw ConfigurationError("invalid I/O niceness \(niceness): expected -20 to 19, or off")
                }
                configuration.ioNiceness = value
            }
        }
        if let prepared = setting("FCM_PREPARED_STATEMENTS") {
            switch prepared.lowercased() {
            case "on", "1", "true", "yes": configuration.preparedStatements = true
            case "off", "0", "false", "no": configuration.preparedStatements = false
            default: throw ConfigurationError("invalid prepared statements setting \(prepared): expected on or off")
            }
        }
        return configuration
    }

    /// `host:port`, `[v6]:port`, or a bare host (port 5235).
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

    static func parseSeconds(_ text: String, name: String) throws(ConfigurationError) -> Duration {
        guard let seconds = Double(text), seconds > 0, seconds <= 86_400 else {
            throw ConfigurationError("invalid \(name) \(text): expected seconds, more than 0")
        }
        return .milliseconds(Int64((seconds * 1000).rounded()))
    }

    /// The settings of the legacy HTTP client (same credentials and trust as XMPP).
    public var httpClient: FCMHTTPClient.Settings {
        var settings = FCMHTTPClient.Settings(serverKey: serverKey, senderID: senderID)
        try? settings.setEndpoint(httpEndpoint)
        settings.trust = caFile.map { .caFile($0) } ?? .systemDefault
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

    public var description: String {
        "sender \(senderID), endpoint \(host):\(port), domain \(xmppDomain), \(connections) connection(s), "
            + "trust \(caFile ?? "system store"), handlers \(handlers.joined(separator: ",")), ack mode \(ackMode.rawValue), "
            + "concurrency \(concurrency), outbox lease \(downstream.lease.formattedSeconds) as \(downstream.workerID), "
            + "database \(databaseURL.map { (try? PostgresConnectionString($0))?.description ?? "(unparsable)" } ?? "none")"
    }
}
