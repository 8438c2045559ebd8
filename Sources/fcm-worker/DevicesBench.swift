import Foundation
import Postgres
import Runtime
import Simulator
import Transport
import Worker

/// `fcm-worker bench devices`: the ingress under load shaped as devices post, one request in
/// flight per connection: HTTP/1.1 keep-alive (`wrk`, every request a new message of one of
/// 1,000 devices), plain and over TLS, and HTTP/2 with one stream per connection over TLS
/// (`h2load -m1`, one body: each request after the first a duplicate, handled once). The
/// same load runs against nginx answering a fixed 200 (Debian's nginx-light, one process,
/// started with a config the bench writes): the worker's CPU per request is printed beside
/// nginx's, in immediate and durable mode.
struct DevicesBench {
    let databaseURL: String
    let connections: Int
    let seconds: Int

    private struct Shape {
        let name: String
        /// wrk (HTTP/1.1) or h2load (HTTP/2, one stream per connection).
        let http2: Bool
        let tls: Bool
    }

    private static let shapes = [
        Shape(name: "HTTP/1.1 keep-alive, plain", http2: false, tls: false),
        Shape(name: "HTTP/1.1 keep-alive, TLS", http2: false, tls: true),
        Shape(name: "HTTP/2 one stream per connection, TLS", http2: true, tls: true),
    ]

    private static func tool(_ name: String) -> String? {
        ["/usr/bin/\(name)", "/usr/sbin/\(name)", "/usr/local/bin/\(name)"].first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    func run() async throws {
        guard let wrk = Self.tool("wrk"), let h2load = Self.tool("h2load"), let nginx = Self.tool("nginx") else {
            throw SimulatorError("bench devices needs wrk, h2load (nghttp2-client) and nginx (nginx-light): scripts/bench installs them")
        }
        try await BenchDatabase.withSchema(in: databaseURL) { url in
            try await measure(url: url, tools: (wrk, h2load, nginx))
        }
    }

    private func measure(url: String, tools: (wrk: String, h2load: String, nginx: String)) async throws {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("bench-devices-\(UUID())").path
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        // nginx's certificate (the worker's comes from the simulator's CA: the load tools verify neither).
        let identity = try CertificateAuthority().issueServerIdentity()
        try identity.certificateChainPEM.write(toFile: folder + "/cert.pem", atomically: true, encoding: .utf8)
        try identity.privateKeyPEM.write(toFile: folder + "/key.pem", atomically: true, encoding: .utf8)
        let cpu = await CPUAccount.locate(databaseURL: url)
        say("device-shaped load: \(connections) connections, one request in flight on each, \(seconds) s a run; "
            + "nginx answers a fixed 200 (one process); CPU per request (user + system)")
        for shape in Self.shapes {
            let floor = try await nginxRun(shape, folder: folder, tools: tools)
            say("\(shape.name):")
            say(String(format: "  nginx: %.0f requests/s, %.1f µs per request", floor.perSecond, floor.microseconds))
            for mode in [WorkerConfiguration.AckMode.immediate, .durable] {
                let worker = try await workerRun(shape, mode: mode, url: url, cpu: cpu, folder: folder, tools: tools)
                say(String(format: "  worker, %@: %.0f requests/s answered 200, %d stored, %.1f µs per request (%.2f× nginx's); "
                           + "PostgreSQL %.1f µs per request", mode.rawValue, worker.perSecond, worker.stored, worker.microseconds,
                           worker.microseconds / floor.microseconds, worker.postgresMicroseconds ?? .nan))
            }
        }
    }

    private struct Figures {
        var perSecond: Double
        var microseconds: Double
        var stored = 0
        var postgresMicroseconds: Double?
    }

    /// nginx with the shape's port, answering `POST /v1/messages` with a fixed 200.
    private func nginxRun(_ shape: Shape, folder: String, tools: (wrk: String, h2load: String, nginx: String)) async throws -> Figures {
        let port = try BenchSetup.freePort()
        let listen = "listen 127.0.0.1:\(port)" + (shape.tls ? " ssl" : "") + (shape.http2 ? " http2" : "") + ";"
        let config = """
            worker_processes 1;
            master_process off;
            daemon off;
            error_log \(folder)/nginx-error.log error;
            pid \(folder)/nginx.pid;
            events { worker_connections 8192; }
            http {
                access_log off;
                client_body_temp_path \(folder)/body;
                server {
                    \(listen)
                    ssl_certificate \(folder)/cert.pem;
                    ssl_certificate_key \(folder)/key.pem;
                    keepalive_requests 1000000;
                    location / { default_type application/json; return 200 '{"message_id":"m","status":"accepted"}'; }
                }
            }
            """
        try config.write(toFile: folder + "/nginx.conf", atomically: true, encoding: .utf8)
        let server = Process()
        server.executableURL = URL(fileURLWithPath: tools.nginx)
        server.arguments = ["-c", folder + "/nginx.conf", "-p", folder]
        server.standardInput = FileHandle.nullDevice
        server.standardOutput = FileHandle.nullDevice
        server.standardError = FileHandle.nullDevice
        try server.run()
        defer {
            // SIGKILL: a child of this process may start with SIGTERM blocked (the worker's
            // signal handling), and nginx answering a fixed 200 has nothing to finish.
            kill(server.processIdentifier, SIGKILL)
            server.waitUntilExit()
        }
        try await Self.waitUntilListening(port: port)
        let token = "Bearer " + String(repeating: "t", count: 777)
        let before = Self.processSeconds(server.processIdentifier)
        let (requests, _) = try await load(shape, port: port, token: token, folder: folder, tools: tools)
        let spent = Self.processSeconds(server.processIdentifier) - before
        return Figures(perSecond: Double(requests) / Double(seconds), microseconds: spent / Double(max(1, requests)) * 1_000_000)
    }

    private func workerRun(_ shape: Shape, mode: WorkerConfiguration.AckMode, url: String, cpu: CPUAccount, folder: String,
                           tools: (wrk: String, h2load: String, nginx: String)) async throws -> Figures {
        try await PostgresConnection.withConnection(url) { connection in
            try await connection.execute("TRUNCATE upstream_messages, processed_upstream, dead_letters")
            try await connection.execute("CHECKPOINT")
        }
        let setup = try await BenchSetup.start(url: url, connections: 1, concurrency: 4, mode: mode, messages: 1, rate: 0, source: .https,
                                               postsItself: false, plainIngress: !shape.tls)
        defer { setup.stop() }
        let port = try await setup.ingressPort()
        let token = "Bearer " + (try String(contentsOfFile: setup.directory + "/id-token", encoding: .utf8)
            .trimmingCharacters(in: .whitespacesAndNewlines))
        let before = cpu.sample()
        let (requests, succeeded) = try await load(shape, port: port, token: token, folder: folder, tools: tools)
        // Every answered message stored (immediate mode commits after its answer).
        let expected = shape.http2 ? 1 : succeeded
        var stored = 0
        let deadline = ContinuousClock.now + .seconds(60)
        while ContinuousClock.now < deadline {
            stored = try await PostgresConnection.withConnection(url) { connection in
                Int(try await connection.query("SELECT count(*) FROM upstream_messages").first?.int(0) ?? 0)
            }
            if stored >= expected { break }
            try await Task.sleep(for: .milliseconds(50))
        }
        let spent = CPUAccount.Spent(from: before, to: cpu.sample(), units: max(1, requests))
        await setup.shutdown()
        return Figures(perSecond: Double(succeeded) / Double(seconds), microseconds: spent.worker, stored: stored,
                       postgresMicroseconds: spent.postgres)
    }

    /// Runs the shape's load tool against 127.0.0.1:`port` for `seconds`; returns the
    /// requests completed and those answered 2xx.
    private func load(_ shape: Shape, port: Int, token: String, folder: String,
                      tools: (wrk: String, h2load: String, nginx: String)) async throws -> (requests: Int, succeeded: Int) {
        let process = Process()
        let scheme = shape.tls ? "https" : "http"
        if shape.http2 {
            let body = folder + "/body.json"
            try #"{"message_id":"h2-1","token":"h2-device","data":{"text":"hello"}}"#.write(toFile: body, atomically: true, encoding: .utf8)
            process.executableURL = URL(fileURLWithPath: tools.h2load)
            process.arguments = ["-D", "\(seconds)", "-c", "\(connections)", "-m", "1", "-t", "1", "-H", "authorization: \(token)",
                                 "-H", "content-type: application/json", "-d", body, "\(scheme)://127.0.0.1:\(port)/v1/messages"]
        } else {
            let script = folder + "/post.lua"
            try Self.wrkScript(token: token).write(toFile: script, atomically: true, encoding: .utf8)
            process.executableURL = URL(fileURLWithPath: tools.wrk)
            process.arguments = ["-t", "1", "-c", "\(connections)", "-d", "\(seconds)s", "-s", script, "\(scheme)://127.0.0.1:\(port)/v1/messages"]
        }
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = FileHandle.nullDevice
        try process.run()
        let output = await Task.detached { String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self) }.value
        while process.isRunning { try await Task.sleep(for: .milliseconds(5)) }
        if shape.http2 {
            // "requests: 100 total, 100 started, 100 done, 100 succeeded, 0 failed, …"
            guard let line = output.split(separator: "\n").first(where: { $0.hasPrefix("requests:") }) else {
                throw SimulatorError("h2load printed no requests line: \(output.suffix(400))")
            }
            let numbers = line.split(whereSeparator: { $0 == " " || $0 == "," }).compactMap { Int($0) }
            guard numbers.count >= 4 else { throw SimulatorError("unreadable h2load line: \(line)") }
            return (numbers[2], numbers[3])
        }
        // "  123456 requests in 5.00s, …" and, when some were not 2xx, "Non-2xx or 3xx responses: N".
        guard let line = output.split(separator: "\n").first(where: { $0.contains(" requests in ") }),
              let requests = Int(line.split(separator: " ").first ?? "") else {
            throw SimulatorError("wrk printed no requests line: \(output.suffix(400))")
        }
        let refused = output.split(separator: "\n").first { $0.contains("Non-2xx or 3xx responses:") }
            .flatMap { Int($0.split(separator: " ").last ?? "") } ?? 0
        return (requests, requests - refused)
    }

    /// wrk's script: each request a new message (a per-thread prefix and a counter) of one
    /// of 1,000 devices of the token's user, with the token in `Authorization`.
    private static func wrkScript(token: String) -> String {
        """
        local threads = 0
        function setup(thread)
            threads = threads + 1
            thread:set("prefix", tostring(threads) .. "-" .. tostring(os.time()))
        end
        local counter = 0
        function request()
            counter = counter + 1
            local body = '{"message_id":"w-' .. prefix .. '-' .. counter .. '","token":"device-' .. (counter % 1000) .. '","data":{"text":"hello"}}'
            return wrk.format("POST", "/v1/messages", {["Content-Type"] = "application/json", ["Authorization"] = "\(token)"}, body)
        end
        """
    }

    private static func waitUntilListening(port: Int) async throws {
        let deadline = ContinuousClock.now + .seconds(10)
        while ContinuousClock.now < deadline {
            if let fd = try? TCPConnector.connect(host: "127.0.0.1", port: port, deadline: .now + .milliseconds(200)) {
                close(fd)
                return
            }
            try await Task.sleep(for: .milliseconds(20))
        }
        throw SimulatorError("nginx did not listen on \(port)")
    }

    /// A process's CPU seconds so far (user + system, from /proc).
    private static func processSeconds(_ pid: Int32) -> Double {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = stat.lastIndex(of: ")") else { return 0 }
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        // After the command: state is field 3; utime 14 and stime 15 are at 11 and 12 here.
        guard fields.count > 12, let user = Double(fields[11]), let system = Double(fields[12]) else { return 0 }
        return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }
}
