import FCM
import Foundation
import Runtime
import Simulator
import Testing
import Transport
import Worker
#if canImport(Glibc)
import Glibc
#endif

/// Debian's Prometheus server.
private let prometheusExecutable = "/usr/bin/prometheus"

/// `deploy/prometheus/fcm-worker-rules.yml` and `deploy/grafana/fcm-worker.json` against a
/// running worker: every metric they name is one the worker exports on `/metrics`, and a
/// real Prometheus (Debian's, which scripts/test installs) scraping a worker through a
/// database outage fires the database alert and resolves it when the database is back.
@Suite(.enabled(if: FileManager.default.isExecutableFile(atPath: prometheusExecutable),
                "needs Debian's prometheus (scripts/test installs it)"))
struct PrometheusRulesTests {
    static let prometheus = prometheusExecutable

    /// The repository's root (this file is Tests/EndToEndTests/PrometheusRulesTests.swift).
    static var root: URL {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    }

    /// The metric names a PromQL text or a dashboard names (`fcm_worker_…`), a histogram's
    /// `_bucket`, `_sum` and `_count` series by the histogram's name; recorded series
    /// (`fcm_worker:…`) left out.
    static func metricNames(in text: String) -> Set<String> {
        let expression = try! NSRegularExpression(pattern: #"(?<![:\w])fcm_worker_[a-z0-9_]+"#)
        var names = Set<String>()
        for match in expression.matches(in: text, range: NSRange(text.startIndex..., in: text)) {
            guard let range = Range(match.range, in: text) else { continue }
            var name = String(text[range])
            for suffix in ["_bucket", "_sum", "_count"] where name.hasSuffix(suffix) && !name.hasSuffix("_total") {
                name = String(name.dropLast(suffix.count))
            }
            names.insert(name)
        }
        return names
    }

    /// The names `/metrics` declares (`# TYPE name …`).
    static func exported(_ page: String) -> Set<String> {
        Set(page.split(separator: "\n").compactMap { line -> String? in
            guard line.hasPrefix("# TYPE ") else { return nil }
            return line.split(separator: " ").dropFirst(2).first.map(String.init)
        })
    }

    /// A loopback port nothing listens on now (bound to port 0, read and closed: the kernel
    /// does not hand it out again at once).
    static func freePort() throws -> Int {
        let bound = try TCPListener.open(host: "127.0.0.1", port: 0, nonBlocking: false, backlog: 1)
        close(bound.fd)
        return bound.port
    }

    @Test func theRulesAndTheDashboardNameOnlyMetricsTheWorkerExportsAndTheDatabaseAlertFiresAndResolves() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        var (configuration, proxy) = try proxiedWorker(ccs, database)
        defer { proxy.stop() }
        configuration.metricsAddress = "127.0.0.1:0"
        let (task, events) = startWorker(configuration)
        defer { task.cancel() }
        try await events.wait(for: "the metrics listener") { $0.contains { if case .serving = $0 { true } else { false } } }
        let metricsPort = try #require(events.all.compactMap { if case .serving(let port) = $0 { port } else { nil } }.first)
        try await ccs.simulator.waitForBoundSessions(1)

        // Every name the rules and the dashboard use is on the worker's page.
        let page = try await httpGet(port: metricsPort, path: "/metrics").body
        let exported = Self.exported(page)
        let rules = try String(contentsOf: Self.root.appendingPathComponent("deploy/prometheus/fcm-worker-rules.yml"), encoding: .utf8)
        let dashboard = try String(contentsOf: Self.root.appendingPathComponent("deploy/grafana/fcm-worker.json"), encoding: .utf8)
        let ruleNames = Self.metricNames(in: rules), dashboardNames = Self.metricNames(in: dashboard)
        #expect(ruleNames.count >= 15 && dashboardNames.count >= 20, "\(ruleNames.count) \(dashboardNames.count)")
        #expect(ruleNames.subtracting(exported).isEmpty, "the rules name what /metrics lacks: \(ruleNames.subtracting(exported).sorted())")
        #expect(dashboardNames.subtracting(exported).isEmpty,
                "the dashboard names what /metrics lacks: \(dashboardNames.subtracting(exported).sorted())")
        // Each of its queries is one Prometheus can parse (JSON: a list of panels with targets).
        let panels = try #require(try JSONValue.parse(dashboard)["panels"]?.arrayValue)
        let queries = panels.flatMap { $0["targets"]?.arrayValue ?? [] }.compactMap { $0["expr"]?.stringValue }
        #expect(queries.count >= panels.count)

        // A real Prometheus: the rules as shipped, the database alert's `for` shortened to
        // seconds, everything evaluated every second.
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("prometheus-\(UUID())")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        let shortened = rules.replacingOccurrences(of: "        expr: fcm_worker_database_reachable == 0\n        for: 1m",
                                                   with: "        expr: fcm_worker_database_reachable == 0\n        for: 3s")
        #expect(shortened != rules, "the database alert's rule is where the test looks for it")
        try shortened.write(to: folder.appendingPathComponent("rules.yml"), atomically: true, encoding: .utf8)
        try """
            global:
              scrape_interval: 1s
              evaluation_interval: 1s
            rule_files: [rules.yml]
            scrape_configs:
              - job_name: fcm-worker
                static_configs:
                  - targets: ['127.0.0.1:\(metricsPort)']
            """.write(to: folder.appendingPathComponent("prometheus.yml"), atomically: true, encoding: .utf8)
        let check = Process()
        check.executableURL = URL(fileURLWithPath: "/usr/bin/promtool")
        check.arguments = ["check", "config", folder.appendingPathComponent("prometheus.yml").path]
        check.standardOutput = FileHandle.nullDevice
        check.environment = childEnvironment()
        // Launched and awaited as every child of the suite is: one launch at a time, and no
        // cooperative-pool thread blocked while it runs.
        try launch(check)
        #expect(await exitStatus(of: check) == 0, "promtool check config")

        let webPort = try Self.freePort()
        let server = Process()
        server.executableURL = URL(fileURLWithPath: Self.prometheus)
        server.arguments = ["--config.file=\(folder.appendingPathComponent("prometheus.yml").path)",
                            "--storage.tsdb.path=\(folder.appendingPathComponent("data").path)",
                            "--web.listen-address=127.0.0.1:\(webPort)", "--log.level=warn"]
        server.currentDirectoryURL = folder
        server.environment = childEnvironment()
        server.standardOutput = FileHandle.nullDevice
        server.standardError = FileHandle.nullDevice
        try launch(server)
        // Stopped at the end (awaited there); on a failure, only told to stop.
        defer { if server.isRunning { server.terminate() } }
        /// The state of the alert FcmWorkerDatabaseDown (`inactive` when Prometheus lists none).
        func databaseAlert() async -> String {
            guard let (status, body) = try? await httpGet(port: webPort, path: "/api/v1/alerts"), status == 200,
                  let alerts = (try? JSONValue.parse(body))?["data"]?["alerts"]?.arrayValue else { return "unknown" }
            return alerts.first { $0["labels"]?["alertname"] == "FcmWorkerDatabaseDown" }?["state"]?.stringValue ?? "inactive"
        }
        func waitFor(_ state: String, _ what: String) async throws {
            let deadline = ContinuousClock.now + .seconds(60)
            var last = ""
            while ContinuousClock.now < deadline {
                last = await databaseAlert()
                if last == state { return }
                try await Task.sleep(for: .milliseconds(250))
            }
            Issue.record("\(what): the alert stayed \(last)")
            throw SimulatorError("the alert did not become \(state)")
        }
        // Scraping the worker (its `up` is 1), and quiet while the database answers.
        let scraping = ContinuousClock.now + .seconds(60)
        var up = ""
        while ContinuousClock.now < scraping {
            up = (try? await httpGet(port: webPort, path: "/api/v1/query?query=up%7Bjob%3D%22fcm-worker%22%7D"))?.body ?? ""
            if up.contains(#""value":["#) && up.contains(#","1"]"#) { break }
            try await Task.sleep(for: .milliseconds(250))
        }
        #expect(up.contains(#","1"]"#), "Prometheus never scraped the worker: \(up)")
        try await waitFor("inactive", "Prometheus scraping a reachable database")
        // The database goes away (refused and cut): the worker's probe says so and the alert fires.
        proxy.set(.refuse)
        proxy.cut()
        try await waitFor("firing", "the database is unreachable")
        // It comes back: the alert resolves.
        proxy.set(.pass)
        try await waitFor("inactive", "the database is back")
        server.terminate()
        _ = await exitStatus(of: server)
    }
}

