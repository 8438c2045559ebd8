import Foundation
import Runtime
import Simulator
import Transport
import Worker

/// `fcm-worker bench connections`: what idle devices cost the worker. It serves its ingress
/// (TLS, immediate mode) against the simulator, measures one device posting alone (one
/// request at a time over HTTP/2), then has a second process (`bench hold-connections`)
/// open `--idle N` TLS HTTP/2 connections that send nothing more, and measures again: the
/// worker's threads, descriptors and memory per idle connection, and the posting device's
/// answer times beside them.
struct ConnectionsBench {
    let databaseURL: String
    let idleConnections: Int
    let probePosts: Int

    func run() async throws {
        let limit = DescriptorLimit.raiseToHard()
        guard limit.after >= idleConnections + 512 else {
            throw SimulatorError("the descriptor limit (\(limit.after)) is too low for \(idleConnections) connections: raise ulimit -Hn")
        }
        try await BenchDatabase.withSchema(in: databaseURL) { url in try await measure(url: url) }
    }

    private func measure(url: String) async throws {
        let setup = try await BenchSetup.start(url: url, connections: 1, concurrency: 4, mode: .immediate, messages: 1, rate: 0,
                                               source: .https, postsItself: false, ingressIdleTimeout: .seconds(3600))
        defer { setup.stop() }
        let port = try await setup.ingressPort()
        let token = try String(contentsOfFile: setup.directory + "/id-token", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        let client = try HTTP2Client(host: "127.0.0.1", port: port, trust: .caFile(setup.directory + "/ca.pem"), maximumConnections: 1)
        _ = try await probe(client, token: token, label: "warm-up", count: 200)
        let alone = try await probe(client, token: token, label: "alone", count: probePosts)
        let before = Self.processFigures()
        say("one device posting alone, one request at a time (\(probePosts) posts): \(alone)")
        say("the worker before: \(before)")

        let holder = Process()
        holder.executableURL = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        holder.arguments = ["bench", "hold-connections", "--port", "\(port)", "--ca-file", setup.directory + "/ca.pem",
                            "--count", "\(idleConnections)"]
        let input = Pipe(), output = Pipe()
        holder.standardInput = input
        holder.standardOutput = output
        let started = ContinuousClock.now
        try holder.run()
        defer {
            try? input.fileHandleForWriting.close()
            holder.waitUntilExit()
        }
        let line = String(decoding: output.fileHandleForReading.availableDataUntilNewline(), as: UTF8.self)
        guard line.hasPrefix("held ") else { throw SimulatorError("the connection holder said: \(line)") }
        // Served: every one of them open on the worker's side.
        let deadline = ContinuousClock.now + .seconds(120)
        while Self.openIngressConnections(setup) < idleConnections + 1 {
            guard ContinuousClock.now < deadline else {
                throw SimulatorError("only \(Self.openIngressConnections(setup)) of \(idleConnections) connections open on the worker")
            }
            try await Task.sleep(for: .milliseconds(50))
        }
        let opened = ContinuousClock.now - started
        let held = try await probe(client, token: token, label: "held", count: probePosts)
        let after = Self.processFigures()
        say("\(idleConnections) idle TLS HTTP/2 connections opened and served in \(opened.formattedSeconds)")
        say("the worker with them: \(after)")
        let perConnection = Double(after.rssKB - before.rssKB) / Double(idleConnections)
        say(String(format: "  per idle connection: %.1f KB of memory, %.2f descriptors, %d threads more in all",
                   perConnection, Double(after.descriptors - before.descriptors) / Double(idleConnections), after.threads - before.threads))
        say("the same device posting beside them: \(held)")
        say(String(format: "  p99 beside them / p99 alone: %.2f×, p50: %.2f×", held.percentile(99) / alone.percentile(99),
                   held.percentile(50) / alone.percentile(50)))
        await setup.shutdown()
    }

    /// One device's posts, one at a time; their answer times.
    private func probe(_ client: HTTP2Client, token: String, label: String, count: Int) async throws -> LatencySummary {
        var latencies: [UInt32] = []
        latencies.reserveCapacity(count)
        for index in 0..<count {
            let body = #"{"message_id":"probe-\#(label)-\#(index)","token":"probe-device","data":{"n":"\#(index)"}}"#
            let started = ContinuousClock.now
            let answer = try await client.send(method: "POST", path: "/v1/messages",
                                               headers: ["content-type": "application/json", "authorization": "Bearer " + token],
                                               body: Array(body.utf8))
            guard answer.status == 200 else { throw SimulatorError("a probe post was answered \(answer.status): \(answer.body)") }
            let elapsed = ContinuousClock.now - started
            latencies.append(UInt32(clamping: elapsed.components.seconds * 1_000_000 + elapsed.components.attoseconds / 1_000_000_000_000))
        }
        return LatencySummary(microseconds: latencies)
    }

    private static func openIngressConnections(_ setup: BenchSetup) -> Int {
        guard let page = setup.metricsPage,
              let line = page.split(separator: "\n").first(where: { $0.hasPrefix("fcm_worker_ingress_connections_open ") }) else { return 0 }
        return Int(Double(line.split(separator: " ").last ?? "") ?? 0)
    }

    /// This process's (the worker's) resident memory, threads and descriptors.
    struct ProcessFigures: CustomStringConvertible {
        let rssKB: Int
        let threads: Int
        let descriptors: Int
        var description: String { "\(rssKB / 1024) MB resident, \(threads) threads, \(descriptors) descriptors" }
    }

    static func processFigures() -> ProcessFigures {
        let status = (try? String(contentsOfFile: "/proc/self/status", encoding: .utf8)) ?? ""
        let rss = status.split(separator: "\n").first { $0.hasPrefix("VmRSS:") }
            .flatMap { Int($0.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") } ?? 0
        let threads = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task").count) ?? 0
        let descriptors = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count) ?? 0
        return ProcessFigures(rssKB: rss, threads: threads, descriptors: descriptors)
    }

    /// `bench hold-connections`: opens `count` TLS connections offering h2, writes HTTP/2's
    /// preface and an empty SETTINGS on each, says `held N`, and keeps them (reading
    /// nothing) until standard input closes.
    static func hold(port: Int, caFile: String, count: Int) throws -> Never {
        DescriptorLimit.raiseToHard()
        let context = try TLSContext.client(trust: .caFile(caFile), protocols: ["h2"])
        let opening = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8) + [0, 0, 0, 4, 0, 0, 0, 0, 0]
        var channels: [TLSChannel] = []
        channels.reserveCapacity(count)
        for _ in 0..<count {
            let channel = try TLSChannel.connect(host: "127.0.0.1", port: port, context: context, deadline: .now + .seconds(30))
            try channel.write(opening, until: .now + .seconds(10))
            channels.append(channel)
        }
        say("held \(channels.count)")
        _ = FileHandle.standardInput.readDataToEndOfFile()
        exit(0)
    }
}

extension FileHandle {
    /// What arrives up to the first newline (or the end).
    func availableDataUntilNewline() -> Data {
        var data = Data()
        while true {
            let chunk = readData(ofLength: 1)
            if chunk.isEmpty || chunk == Data([10]) { return data }
            data.append(chunk)
        }
    }
}
