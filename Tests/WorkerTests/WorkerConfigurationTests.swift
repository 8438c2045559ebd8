import Foundation
import Testing
import Worker
import XMPP

@Suite struct WorkerConfigurationTests {
    private let base = ["FCM_SENDER_ID": "123", "FCM_SERVER_KEY": "k"]

    @Test func withoutCCSTheIngressIsRequiredAndTheCredentialsAreNot() throws {
        // No source at all: refused, naming what to give.
        #expect {
            try WorkerConfiguration.parse(arguments: ["--connections", "0"], environment: base)
        } throws: { error in
            "\(error)".contains("--ingress-address")
        }
        // The ingress alone, without a sender ID or a server key: only v1 (with a service
        // account) could send; xmpp and http rows wait.
        let ingressOnly = try WorkerConfiguration.parse(arguments: ["--connections", "0", "--ingress-address", "127.0.0.1:8443",
                                                                    "--ingress-tls-cert", "/c.pem", "--ingress-tls-key", "/k.pem",
                                                                    "--ingress-project-id", "p"], environment: [:])
        #expect(ingressOnly.connections == 0 && ingressOnly.serverKey.isEmpty)
        #expect(ingressOnly.sendableTransports.isEmpty)
        #expect(try WorkerConfiguration.parse(arguments: [], environment: base).sendableTransports == ["xmpp", "http"])
        // With CCS the credentials stay required.
        #expect(throws: (any Error).self) { try WorkerConfiguration.parse(arguments: [], environment: [:]) }
    }

    @Test func defaultsMatchTheDocumentedTable() throws {
        let configuration = try WorkerConfiguration.parse(arguments: [], environment: base)
        #expect(configuration.host == "fcm-xmpp.googleapis.com")
        #expect(configuration.port == 5235)
        #expect(configuration.xmppDomain == "gcm.googleapis.com")
        #expect(configuration.caFile == nil)
        #expect(configuration.connections == 1)
        #expect(configuration.handlers == nil, "the executable's default (the stock one: store)")
        #expect(configuration.xmppClient.credentials.authenticationIdentity == "123@gcm.googleapis.com")
        #expect(configuration.xmppClient.trust == .systemDefault)
        #expect(configuration.ioNiceness == -10 && configuration.xmppClient.threadNiceness == -10)
    }

    @Test func secretsGivenAsFlagsAreWarnedOfAndTheSafeWaysAreNot() {
        let warned = WorkerConfiguration.secretsInArguments(["--server-key", "AAAA", "--database-url=postgresql://fcm:s3cret@db/fcm",
                                                             "--database-direct-url", "host=db password=s3cret"])
        #expect(warned.count == 3, "\(warned)")
        #expect(warned.allSatisfy { $0.contains("ps") && !$0.contains("s3cret") && !$0.contains("AAAA") })
        #expect(WorkerConfiguration.secretsInArguments(["--server-key-file", "/k", "--database-url", "postgresql://fcm@db/fcm"]).isEmpty)
    }

    @Test func ioNicenessParses() throws {
        let off = try WorkerConfiguration.parse(arguments: ["--io-niceness", "off"], environment: base)
        #expect(off.ioNiceness == nil && off.xmppClient.threadNiceness == nil)
        let set = try WorkerConfiguration.parse(arguments: [], environment: base.merging(["FCM_IO_NICENESS": "-5"]) { $1 })
        #expect(set.xmppClient.threadNiceness == -5)
    }

    @Test func preparedStatementsCanBeTurnedOff() throws {
        #expect(try WorkerConfiguration.parse(arguments: [], environment: base).preparedStatements)
        #expect(try !WorkerConfiguration.parse(arguments: ["--prepared-statements", "off"], environment: base).preparedStatements)
        #expect(throws: ConfigurationError.self) {
            try WorkerConfiguration.parse(arguments: ["--prepared-statements", "sometimes"], environment: base)
        }
    }

    /// Behind a transaction pooler nothing is prepared, and sessions (LISTEN, migrations)
    /// go to the direct URL, or nowhere without one.
    @Test func aTransactionPoolerTurnsPreparedStatementsOffAndSendsSessionsToTheDirectURL() throws {
        let direct = try WorkerConfiguration.parse(arguments: [], environment: base.merging(["DATABASE_URL": "postgresql://db/fcm"]) { $1 })
        #expect(direct.databasePooler == .none && direct.preparesStatements && direct.sessionDatabaseURL == "postgresql://db/fcm")
        let pooled = try WorkerConfiguration.parse(arguments: ["--database-url", "postgresql://pooler:6432/fcm", "--database-pooler", "transaction"],
                                                   environment: base)
        #expect(!pooled.preparesStatements && pooled.sessionDatabaseURL == nil)
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("direct-\(UUID())").path
        try "postgresql://db:5432/fcm\n".write(toFile: file, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: file) }
        let withDirect = try WorkerConfiguration.parse(arguments: ["--database-url", "postgresql://pooler:6432/fcm"],
                                                       environment: base.merging(["FCM_DATABASE_POOLER": "transaction",
                                                                                  "FCM_DATABASE_DIRECT_URL_FILE": file]) { $1 })
        #expect(withDirect.sessionDatabaseURL == "postgresql://db:5432/fcm" && !withDirect.preparesStatements)
        #expect(throws: ConfigurationError.self) {
            try WorkerConfiguration.parse(arguments: ["--database-pooler", "statement"], environment: base)
        }
        #expect(throws: ConfigurationError.self) {
            try WorkerConfiguration.parse(arguments: ["--database-direct-url", "postgresql://h:notaport/d"], environment: base)
        }
    }

    @Test func flagsWinOverEnvironment() throws {
        let environment = base.merging(["FCM_ENDPOINT": "env.example:1", "FCM_CONNECTIONS": "2"]) { $1 }
        let configuration = try WorkerConfiguration.parse(
            arguments: ["--endpoint", "127.0.0.1:5236", "--connections=4", "--xmpp-domain", "fcm.googleapis.com", "--handlers", "store, echo"],
            environment: environment)
        #expect(configuration.host == "127.0.0.1" && configuration.port == 5236)
        #expect(configuration.connections == 4)
        #expect(configuration.xmppDomain == "fcm.googleapis.com")
        #expect(configuration.handlers == ["store", "echo"])
        // The domain is never derived from the TCP host.
        #expect(configuration.xmppClient.credentials.domain == "fcm.googleapis.com")
    }

    @Test func endpointsParse() throws {
        let cases: [(String, String, Int)] = [("host:1", "host", 1), ("[::1]:5236", "::1", 5236), ("bare.example", "bare.example", 5235)]
        for (text, host, port) in cases {
            let configuration = try WorkerConfiguration.parse(arguments: ["--endpoint", text], environment: base)
            #expect(configuration.host == host && configuration.port == port, "\(text)")
        }
    }

    @Test func upstreamSettingsParse() throws {
        let configuration = try WorkerConfiguration.parse(
            arguments: ["--ack-mode", "durable", "--concurrency", "8", "--max-attempts", "3", "--migrate",
                        "--shutdown-timeout", "2.5", "--spool-file", "/tmp/x.spool"], environment: base)
        #expect(configuration.ackMode == .durable)
        #expect(configuration.concurrency == 8 && configuration.pipeline.partitions == 8)
        #expect(configuration.maxAttempts == 3 && configuration.pipeline.maxAttempts == 3)
        #expect(configuration.migrate)
        #expect(configuration.shutdownTimeout == .milliseconds(2500))
        #expect(configuration.spoolFile == "/tmp/x.spool")
        #expect(throws: ConfigurationError.self) { try WorkerConfiguration.parse(arguments: ["--ack-mode", "later"], environment: base) }
    }

    @Test func downstreamSettingsParse() throws {
        let defaults = try WorkerConfiguration.parse(arguments: [], environment: base)
        #expect(defaults.downstream.lease == .seconds(60) && defaults.downstream.retry.base == .seconds(1))
        #expect(defaults.downstream.retry.maximumAge == .seconds(86_400))
        #expect(defaults.downstream.workerID.hasSuffix(defaults.downstream.workerID.split(separator: ":").last.map(String.init) ?? "?"))
        let configuration = try WorkerConfiguration.parse(
            arguments: ["--outbox-lease", "30", "--retry-base", "0.5", "--retry-max-age", "3600", "--worker-id", "worker-a"],
            environment: base)
        #expect(configuration.downstream.lease == .seconds(30))
        #expect(configuration.downstream.retry.base == .milliseconds(500))
        #expect(configuration.downstream.retry.maximumAge == .seconds(3600))
        #expect(configuration.downstream.workerID == "worker-a")
        #expect(configuration.description.contains("as worker-a"))
    }

    @Test func serverKeyFromFile() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("key-\(UUID())").path
        try "  file-key\n".write(toFile: path, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: path) }
        let configuration = try WorkerConfiguration.parse(arguments: ["--server-key-file", path], environment: ["FCM_SENDER_ID": "1"])
        #expect(configuration.serverKey == "file-key")
    }

    @Test func eachBadSettingGetsOneClearLine() {
        let cases: [([String], [String: String], String)] = [
            ([], [:], "missing sender ID"),
            ([], ["FCM_SENDER_ID": "1"], "missing server key"),
            (["--endpoint", "host:99999"], base, "invalid endpoint port"),
            (["--endpoint", "host:abc"], base, "invalid endpoint port"),
            (["--connections", "1001"], base, "invalid connection count"),
            (["--connections", "many"], base, "invalid connection count"),
            (["--ca-file", "/nonexistent/ca.pem"], base, "does not exist"),
            (["--server-key-file", "/nonexistent/key"], ["FCM_SENDER_ID": "1"], "cannot read the server key file"),
            (["--bogus", "1"], base, "unknown option --bogus"),
            (["--sender-id"], base, "needs a value"),
            (["--sender-id", "12 3"], base, "invalid sender ID"),
            (["--ping-interval", "-1"], base, "invalid ping interval"),
            (["--outbox-lease", "0.5"], base, "invalid outbox lease"),
            (["--retry-base", "soon"], base, "invalid retry base"),
            (["--io-niceness", "-21"], base, "invalid I/O niceness"),
            (["--io-niceness", "high"], base, "invalid I/O niceness"),
            // An empty flag value is an error, never the default in disguise.
            (["--connections="], base, "--connections is given an empty value"),
            (["--handlers", ""], base, "--handlers is given an empty value"),
            (["--handlers", " , "], base, "--handlers names no handler"),
            (["--ping-interval", "0.001"], base, "invalid ping interval 0.001: expected at least 1.0 s"),
            (["--ping-timeout", "0.5"], base, "invalid ping timeout 0.5: expected at least 1.0 s"),
            (["--database-url-file", "/nonexistent/url"], base, "cannot read the database URL file /nonexistent/url"),
        ]
        for (arguments, environment, expected) in cases {
            do {
                _ = try WorkerConfiguration.parse(arguments: arguments, environment: environment)
                Issue.record("accepted \(arguments) \(environment)")
            } catch {
                #expect(error.description.contains(expected), "\(arguments): \(error.description)")
                #expect(!error.description.contains("\n"))
            }
        }
    }

    @Test func descriptionNeverShowsTheServerKey() throws {
        let configuration = try WorkerConfiguration.parse(
            arguments: ["--server-key", "SECRET-KEY-VALUE", "--database-url", "postgresql://fcm:db-PASSWORD@db.internal/fcm"],
            environment: ["FCM_SENDER_ID": "1"])
        #expect(!configuration.description.contains("SECRET-KEY-VALUE"))
        #expect(!configuration.description.contains("db-PASSWORD"))
        #expect(configuration.description.contains("user=fcm password=*** dbname=fcm host=db.internal"))
    }

    @Test func aKeyFileOfSeveralLinesIsRefusedAndOneOthersCanReadIsWarnedAbout() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("key-\(UUID())").path
        try "first-line\nsecond-line\n".write(toFile: path, atomically: true, encoding: .utf8)
        #expect(throws: ConfigurationError("the server key file \(path) holds more than one line: a server key is one line")) {
            try WorkerConfiguration.parse(arguments: ["--server-key-file", path], environment: ["FCM_SENDER_ID": "1"])
        }
        try "the-key\r\n".write(toFile: path, atomically: true, encoding: .utf8)
        try FileManager.default.setAttributes([.posixPermissions: 0o644], ofItemAtPath: path)
        let readable = try WorkerConfiguration.parse(arguments: ["--server-key-file", path], environment: ["FCM_SENDER_ID": "1"])
        #expect(readable.serverKey == "the-key")
        #expect(readable.warnings.count == 1 && readable.warnings[0].contains("can be read by group or others"))
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: path)
        #expect(try WorkerConfiguration.parse(arguments: ["--server-key-file", path], environment: ["FCM_SENDER_ID": "1"]).warnings.isEmpty)
    }

    @Test func whatCodeSetsIsWhatRuns() {
        var configuration = WorkerConfiguration(senderID: "1", serverKey: "k")
        configuration.maxAttempts = 1
        configuration.concurrency = 7
        #expect(configuration.pipeline.maxAttempts == 1)
        #expect(configuration.pipeline.partitions == 7)
    }

    @Test func anUnparsableDatabaseURLIsAConfigurationErrorThatShowsNoSecret() {
        for url in ["postgresql://user:s3cret@host:notaport/db", "postgresql://user:s3cret@host/db?bogus=%zz", "host=x password=s3cret = broken"] {
            do {
                _ = try WorkerConfiguration.parse(arguments: ["--database-url", url], environment: base)
                Issue.record("\(url) was accepted")
            } catch {
                #expect(!error.description.contains("s3cret"), "\(error.description)")
                #expect(!error.description.contains("\n"))
            }
        }
    }

    /// Flags win over variables, also across the two ways of giving the server key (an
    /// `FCM_SERVER_KEY` in the environment beat `--server-key-file` on the command line);
    /// given the same way, the key wins over the file.
    @Test func flagsWinOverVariablesAcrossTheServerKeyAndItsFile() throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("key-\(UUID())").path
        try "key-from-file\n".write(toFile: file, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: file) }
        let sender = ["FCM_SENDER_ID": "1"]
        func key(_ arguments: [String], _ environment: [String: String]) throws -> String {
            try WorkerConfiguration.parse(arguments: arguments, environment: sender.merging(environment) { $1 }).serverKey
        }
        #expect(try key(["--server-key-file", file], ["FCM_SERVER_KEY": "key-from-env"]) == "key-from-file")
        #expect(try key(["--server-key", "key-from-flag"], ["FCM_SERVER_KEY_FILE": file]) == "key-from-flag")
        #expect(try key(["--server-key", "key-from-flag", "--server-key-file", file], [:]) == "key-from-flag")
        #expect(try key([], ["FCM_SERVER_KEY": "key-from-env", "FCM_SERVER_KEY_FILE": file]) == "key-from-env")
        #expect(try key([], ["FCM_SERVER_KEY_FILE": file]) == "key-from-file")
        // An empty variable is unset, as before.
        #expect(try WorkerConfiguration.parse(arguments: [], environment: base.merging(["FCM_CONNECTIONS": ""]) { $1 }).connections == 1)
    }

    /// A CA file that holds no certificate is refused at start (exit 2), not at the first
    /// connection (where it exited 1, and a supervisor restarted it in a loop).
    @Test func aCAFileWithoutACertificateIsRefusedAtStart() throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("ca-\(UUID()).pem").path
        defer { try? FileManager.default.removeItem(atPath: file) }
        for (garbage, reason) in [(Data("this is not a certificate\n".utf8), "holds no PEM certificate OpenSSL can read"),
                                  (Data([0xff, 0xfe, 0x00, 0x9c]), "is not PEM text")] {
            try garbage.write(to: URL(fileURLWithPath: file))
            #expect(throws: ConfigurationError("the CA file \(file) \(reason)")) {
                try WorkerConfiguration.parse(arguments: ["--ca-file", file], environment: base)
            }
        }
    }

    /// The database URL from a file (out of `ps` and the environment), one line; the URL
    /// given the same way wins over it.
    @Test func theDatabaseURLComesFromAFile() throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("db-\(UUID())").path
        try "postgresql://fcm:file-secret@db.internal/fcm\n".write(toFile: file, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: file) }
        let configuration = try WorkerConfiguration.parse(arguments: ["--database-url-file", file], environment: base)
        #expect(configuration.databaseURL == "postgresql://fcm:file-secret@db.internal/fcm")
        #expect(configuration.warnings.contains { $0.contains("can be read by group or others") })
        let both = try WorkerConfiguration.parse(arguments: ["--database-url-file", file, "--database-url", "postgresql://other/db"],
                                                 environment: base)
        #expect(both.databaseURL == "postgresql://other/db")
        try "postgresql://a/b\npostgresql://c/d\n".write(toFile: file, atomically: true, encoding: .utf8)
        #expect(throws: ConfigurationError("the database URL file \(file) must hold one line")) {
            try WorkerConfiguration.parse(arguments: ["--database-url-file", file], environment: base)
        }
    }
}
