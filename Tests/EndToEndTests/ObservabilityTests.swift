import FCM
import Foundation
import Runtime
import Simulator
import Testing
import Transport
@testable import Upstream
@testable import Worker

/// A plain HTTP GET on loopback: status line and body.
/// Runs blocking socket calls on a thread of their own: on the cooperative pool (two
/// threads here) they would starve the worker under test.
func blocking<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    let thread = DedicatedThread(name: "test socket")
    defer { thread.shutdown() }
    return try await thread.run(body)
}

func httpGet(port: Int, path: String, timeout seconds: Int = 10) async throws -> (status: Int, body: String) {
    try await blocking {
        guard let fd = connectedLoopbackSocket(port: port, receiveTimeout: seconds) else {
            throw SimulatorError("cannot connect to the metrics port \(port)")
        }
        defer { close(fd) }
        // Connection: close, so that a keep-alive server (Prometheus's API) ends the answer
        // by closing, as the worker's own server does.
        let request = Array("GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".utf8)
        _ = request.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        var response: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            guard count > 0 else { break }
            response += buffer[..<count]
        }
        let text = String(decoding: response, as: UTF8.self)
        guard let split = text.range(of: "\r\n\r\n"), let status = Int(text.split(separator: " ").dropFirst().first ?? "") else {
            throw SimulatorError("not an HTTP response: \(text.prefix(200))")
        }
        return (status, String(text[split.upperBound...]))
    }
}

/// Checks a page against the Prometheus text format (0.0.4) and returns its samples by
/// name with labels (`name{a="b"}`).
func parsePrometheus(_ page: String) throws -> [String: Double] {
    var samples: [String: Double] = [:]
    var types: [String: String] = [:]
    for line in page.split(separator: "\n", omittingEmptySubsequences: false) {
        if line.isEmpty { continue }
        if line.hasPrefix("# HELP ") { continue }
        if line.hasPrefix("# TYPE ") {
            let parts = line.split(separator: " ")
            guard parts.count == 4, ["counter", "gauge", "histogram", "summary", "untyped"].contains(parts[3]) else {
                throw SimulatorError("bad TYPE line: \(line)")
            }
            guard types.updateValue(String(parts[3]), forKey: String(parts[2])) == nil else { throw SimulatorError("family twice: \(line)") }
            continue
        }
        guard let space = line.lastIndex(of: " ") else { throw SimulatorError("no value: \(line)") }
        let series = String(line[..<space])
        let valueText = line[line.index(after: space)...]
        guard let value = Double(valueText) ?? (valueText == "+Inf" ? .infinity : nil) else { throw SimulatorError("bad value: \(line)") }
        let name = String(series.prefix { $0 != "{" })
        guard name.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "_" || $0 == ":" }), name.first?.isNumber == false else {
            throw SimulatorError("bad metric name: \(line)")
        }
        let family = types[name] != nil ? name : ["_bucket", "_sum", "_count"].compactMap { suffix in
            name.hasSuffix(suffix) ? String(name.dropLast(suffix.count)) : nil
        }.first { types[$0] == "histogram" }
        guard let family, types[family] != nil else { throw SimulatorError("sample before its TYPE: \(line)") }
        if types[family] == "counter" && !name.hasSuffix("_total") && !name.hasSuffix("_info") {
            throw SimulatorError("a counter not named _total: \(name)")
        }
        if series.contains("{") {
            guard series.hasSuffix("}"), series.range(of: #"^[a-z_:][a-z0-9_:]*\{([a-z_]+="([^"\\]|\\.)*")(,[a-z_]+="([^"\\]|\\.)*")*\}$"#,
                                                      options: .regularExpression) != nil else {
                throw SimulatorError("bad labels: \(line)")
            }
        }
        samples[series] = value
    }
    return samples
}

@Suite struct ObservabilityTests {
    @Test func metricsParseAndMoveWithTrafficAndProbesFollowTheSimulatorAndTheDatabase() async throws {
        let ccs = try TestCCS()
        let (database, name) = try await TestDatabase.makeDedicated()
        var configuration = try ccs.worker(database: database)
        configuration.metricsAddress = "127.0.0.1:0"
        configuration.reconnectBase = .milliseconds(50)
        configuration.reconnectCap = .milliseconds(200)
        // A row due in an hour: the backlog gauge counts it (read by the first probe).
        _ = try await database.query("""
            INSERT INTO downstream_messages (target, payload, status, available_at)
            VALUES ('tok-later', '{"data": {}}', 'retry', now() + interval '1 hour')
            """)
        let (task, events) = startWorker(configuration)
        defer { task.cancel() }
        try await events.wait(for: "the metrics listener") { $0.contains { if case .serving = $0 { true } else { false } } }
        let port = events.all.compactMap { if case .serving(let port) = $0 { port } else { nil } }.first!
        try await ccs.simulator.waitForBoundSessions(1)

        let lastReadiness = BlockingLock("")
        func ready() async throws -> Bool {
            // A busy test process may miss a request's deadline: that is an answer of "not yet".
            guard let (status, body) = try? await httpGet(port: port, path: "/readyz") else { return false }
            lastReadiness.withLock { $0 = body }
            return status == 200
        }
        try await waitUntil("ready", within: .seconds(15), every: .milliseconds(100), detail: "/readyz said \(lastReadiness.withLock { $0 })") {
            try await ready()
        }
        #expect(try await httpGet(port: port, path: "/healthz").status == 200)
        #expect(try await httpGet(port: port, path: "/nothing").status == 404)

        let before = try parsePrometheus(try await httpGet(port: port, path: "/metrics").body)
        #expect(before["fcm_worker_upstream_received_total"] == 0)
        #expect(before["fcm_worker_ccs_connections{state=\"open\"}"] == 1)
        #expect(before["fcm_worker_build_info{version=\"\(WorkerMain.version)\"}"] == 1)
        #expect(before["fcm_worker_outbox_rows{transport=\"xmpp\",status=\"retry\"}"] == 1)
        #expect(before["fcm_worker_outbox_oldest_due_age_seconds{transport=\"xmpp\"}"] == 0, "not due yet")
        for index in 0..<20 { ccs.simulator.injectUpstream(from: "device-\(index % 3)", messageID: "m\(index)") }
        _ = try await database.query("INSERT INTO downstream_messages (target, payload) VALUES ('tok-1', '{\"data\": {\"a\": \"b\"}}')")
        try await events.wait(for: "20 handled") { events in
            events.reduce(0) { count, event in if case .committed(let handled, _, _) = event { count + handled.count } else { count } } >= 20
        }
        try await ccs.simulator.wait(for: "the downstream message") { $0.contains { if case .downstreamAnswered = $0 { true } else { false } } }
        try await waitUntil("the downstream ack in the metrics") {
            (try parsePrometheus(try await httpGet(port: port, path: "/metrics").body))["fcm_worker_downstream_total{transport=\"xmpp\",outcome=\"acked\"}"] == 1
        }
        let after = try parsePrometheus(try await httpGet(port: port, path: "/metrics").body)
        #expect(after["fcm_worker_upstream_received_total"] == 20)
        #expect(after["fcm_worker_upstream_acked_total"] == 20)
        #expect(after["fcm_worker_upstream_handled_total"] == 20)
        #expect(after["fcm_worker_handler_runs_total{handler=\"store\"}"] == 20)
        #expect(after["fcm_worker_upstream_receive_to_commit_seconds_count"] == 20)
        #expect(after["fcm_worker_downstream_total{transport=\"xmpp\",outcome=\"sent\"}"] == 1)
        #expect(after["fcm_worker_downstream_ack_seconds_count"] == 1)
        #expect((after["fcm_worker_upstream_batch_size_count"] ?? 0) >= 1)

        // The simulator goes away: unready; a new one on the same port: ready again.
        let port0 = ccs.simulator.port
        ccs.simulator.stop()
        try await waitUntil("unready without CCS") { (try? await httpGet(port: port, path: "/readyz").status) == 503 }
        #expect(try await httpGet(port: port, path: "/readyz").body.contains("no CCS connection"))
        #expect(try await httpGet(port: port, path: "/healthz").status == 200)
        let second = try TestCCS(authority: ccs.authority, configure: { $0.port = port0 })
        defer { second.simulator.stop() }
        try await waitUntil("ready with CCS back") { try await ready() }

        // The database goes away: unready; back: ready again.
        try await TestDatabase.cutOff(name)
        try await waitUntil("unready without the database") { (try? await httpGet(port: port, path: "/readyz").status) == 503 }
        #expect(try await httpGet(port: port, path: "/readyz").body.contains("database"))
        try await TestDatabase.restore(name)
        try await waitUntil("ready with the database back") { try await ready() }
        task.cancel()
        try await task.value
    }

    /// Idle connections delayed `/healthz` by 2 s each (one connection served at a time):
    /// 18 made a `curl -m 3` probe fail. Now every connection is served at once, and the
    /// oldest go when there are more than the server keeps.
    @Test func idleConnectionsNeverDelayAProbe() async throws {
        let server = try MetricsServer(address: "127.0.0.1:0", routes: .init(metrics: { "up 1\n" },
                                                                              health: { .init(ok: true, reason: "ok") },
                                                                              readiness: { .init(ok: true, reason: "ready") }),
                                       requestDeadline: .seconds(30), maximumConnections: 64)
        defer { server.stop() }
        let port = server.port
        // 100 connections that never send a byte, and one that sends half a request.
        let idle = try await blocking { () -> [Int32] in
            var fds: [Int32] = []
            for index in 0..<101 {
                let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
                var address = sockaddr_in()
                address.sin_family = sa_family_t(AF_INET)
                address.sin_port = in_port_t(UInt16(port).bigEndian)
                address.sin_addr.s_addr = inet_addr("127.0.0.1")
                let connected = withUnsafePointer(to: &address) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
                }
                guard connected == 0 else { throw SimulatorError("connection \(index) refused") }
                if index == 100 { _ = Array("GET /metr".utf8).withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) } }
                fds.append(fd)
            }
            return fds
        }
        defer { for fd in idle { close(fd) } }
        // A probe with curl -m 3's patience: answered, however many wait.
        for path in ["/healthz", "/readyz", "/metrics"] {
            let answer = try await httpGet(port: port, path: path, timeout: 3)
            #expect(answer.status == 200, "\(path)")
        }
        #expect(try await httpGet(port: port, path: "/metrics", timeout: 3).body == "up 1\n")
    }

    @Test func logLinesAreOneEntryEachAndJSONParses() throws {
        var lines: [String] = []
        let collected = BlockingLock<[String]>([])
        let logger = Logger(label: "pipeline", minimumLevel: .trace, format: .json) { line in collected.withLock { $0.append(line) } }
        logger.warning("libpq said:\n\tFATAL: no\r\"quoted\" \\ \u{1}", metadata: ["message_id": "up-1", "connection": "ccs#1"])
        logger.trace("fine")
        lines = collected.withLock { $0 }
        #expect(lines.count == 2)
        for line in lines { #expect(!line.contains("\n")) }
        let object = try JSONValue.parse(lines[0])
        #expect(object["level"] == "warning")
        #expect(object["label"] == "pipeline")
        #expect(object["message"] == .string("libpq said:\n\tFATAL: no\r\"quoted\" \\ \u{1}"))
        #expect(object["message_id"] == "up-1")
        #expect(object["connection"] == "ccs#1")
        #expect(object["time"]?.stringValue?.hasSuffix("Z") == true)
        let text = Logger.entry(level: .error, label: "ccs#1", message: "a\nb", metadata: ["connection": "ccs#1", "reason": "two words"],
                                 as: .text, at: Date(timeIntervalSince1970: 0))
        #expect(text == #"1970-01-01T00:00:00.000Z error   [ccs#1] a\nb connection=ccs#1 reason="two words""#)
        #expect(Logger.Level(name: "NOTICE") == .notice)
        #expect(Logger.Level(name: "verbose") == nil)
    }
}

import Synchronization
import TestSupport

/// The worker as systemd runs it: notifications on `NOTIFY_SOCKET`, JSON logs, SIGHUP.
@Suite struct SystemdNotificationTests {
    /// A datagram socket like systemd's notify socket; returns its descriptor and path.
    static func notifySocket() throws -> (Int32, String) {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("notify-\(UUID().uuidString.prefix(8))").path
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(path.utf8) + [0]) }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard bound == 0 else { throw SimulatorError("cannot bind \(path)") }
        var timeout = timeval(tv_sec: 0, tv_usec: 200_000)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        return (fd, path)
    }

    /// Datagrams received until `predicate` holds for one of them, or `limit` passes.
    static func receive(_ fd: Int32, until predicate: @escaping @Sendable (String) -> Bool, limit: Duration) async -> [String] {
        (try? await blocking {
            var received: [String] = []
            let deadline = ContinuousClock.now + limit
            var buffer = [UInt8](repeating: 0, count: 4096)
            while ContinuousClock.now < deadline {
                let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
                guard count > 0 else { continue }
                let message = String(decoding: buffer[..<count], as: UTF8.self)
                received.append(message)
                if predicate(message) { break }
            }
            return received
        }) ?? []
    }

    @Test func readyWatchdogAndStoppingReachSystemdAndSIGHUPIsIgnored() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let (fd, path) = try Self.notifySocket()
        defer { close(fd); unlink(path) }
        let spool = FileManager.default.temporaryDirectory.appendingPathComponent("spool-\(UUID())").path
        let (process, errors) = try WorkerProcess.start(ccs, databaseURL: database.url, spool: spool, ["--log-format", "json"],
                                                        environment: ["NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000"])
        let ready = await Self.receive(fd, until: { $0.contains("READY=1") }, limit: .seconds(15))
        #expect(ready.contains { $0.contains("READY=1") }, "\(ready)")
        let watchdog = await Self.receive(fd, until: { $0 == "WATCHDOG=1" }, limit: .seconds(5))
        #expect(watchdog.contains("WATCHDOG=1"))
        kill(process.processIdentifier, SIGHUP)
        try await Task.sleep(for: .milliseconds(300))
        #expect(process.isRunning, "SIGHUP ended the worker")
        _ = try await WorkerProcess.terminate(process, limit: .seconds(20))
        #expect(process.terminationStatus == 0)
        let stopping = await Self.receive(fd, until: { $0 == "STOPPING=1" }, limit: .seconds(2))
        #expect(stopping.contains("STOPPING=1"))
        let lines = String(decoding: await readToEnd(errors.fileHandleForReading), as: UTF8.self).split(separator: "\n")
        #expect(lines.count > 3)
        for line in lines {
            let entry = try JSONValue.parse(String(line))
            #expect(entry["time"]?.stringValue?.hasSuffix("Z") == true)
            #expect(entry["level"]?.stringValue.flatMap(Logger.Level.init(name:)) != nil)
        }
    }
}
