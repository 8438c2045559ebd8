import FCM
import Foundation
import Handlers
import Postgres
import Runtime
import Simulator
import Synchronization
import Transport
import Worker

/// `fcm-worker bench soak`: steady mixed load for a long time, with faults at regular
/// intervals, watching for anything that grows without bound and for lost messages.
///
/// The simulator runs in this process (the faults need its controls), so the figures are
/// the worker's and the simulator's together. Load: `upstreamRate` upstream messages a
/// second (the `store` handler) and `downstreamRate` outbox rows a second (inserted with
/// SQL, sent over XMPP). Faults, one every `faultInterval` in turn: a dropped CCS
/// connection, a drained one, a burst of `SERVICE_UNAVAILABLE` nacks for 3 s, and every
/// PostgreSQL session of the worker terminated (`pg_terminate_backend`, what a database
/// restart does to its clients). Every 10 s it prints RSS, open descriptors, threads, the
/// upstream and outbox backlogs and the losses so far. At the end it stops the load, waits
/// for everything to settle, and fails when anything acked is missing, an outbox row never
/// reached a final state, or RSS, descriptors or threads kept growing (the last third's
/// median well above the first third's after warm-up; judged only when the load ran for two
/// rounds of the faults, since in one round a pool filling once looks like a leak).
struct SoakBench {
    let databaseURL: String
    let minutes: Double
    let upstreamRate: Int
    let downstreamRate: Int
    let ackMode: CCSAckMode
    let faultInterval: Duration
    /// Which faults take turns (all four by default).
    let faults: [Fault]

    /// The faults the soak makes.
    enum Fault: String, CaseIterable, Sendable {
        /// A CCS connection dropped (the TCP connection cut).
        case drop
        /// CCS drains a connection (`CONNECTION_DRAINING`).
        case drain
        /// `SERVICE_UNAVAILABLE` nacks for 3 s.
        case nack
        /// Every PostgreSQL session of the worker terminated.
        case database
    }

    /// One line of figures.
    struct Sample {
        var elapsed: Double
        var residentMegabytes: Double
        var descriptors: Int
        /// Pipes among the descriptors (each stream loop and database connection has one).
        var pipes: Int
        var threads: Int
    }

    /// Acked upstream ids, one bit per message number.
    final class AckedSet: Sendable {
        private let bits = BlockingLock([UInt64]())
        private let distinct = Atomic(0)

        func insert(_ number: Int) {
            let added = bits.withLock { bits -> Bool in
                let word = number / 64
                if word >= bits.count { bits += [UInt64](repeating: 0, count: word - bits.count + 1024) }
                let mask = UInt64(1) << UInt64(number % 64)
                guard bits[word] & mask == 0 else { return false }
                bits[word] |= mask
                return true
            }
            if added { distinct.add(1, ordering: .relaxed) }
        }

        var count: Int { distinct.load(ordering: .relaxed) }
    }

    /// Returns true when the soak passed.
    func run() async throws -> Bool {
        say("fcm-worker bench soak: \(String(format: "%g", minutes)) minute(s), \(upstreamRate) upstream msgs/s, "
            + "\(downstreamRate) outbox rows/s, \(ackMode.rawValue) ack mode, a fault every \(faultInterval.formattedSeconds)")
        var passed = false
        try await BenchDatabase.withSchema(in: databaseURL) { url in passed = try await soak(url: url) }
        return passed
    }

    private func soak(url: String) async throws -> Bool {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("soak-\(UUID())").path
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let authority = try CertificateAuthority()
        let caPath = folder + "/ca.pem"
        try authority.rootCertificatePEM.write(toFile: caPath, atomically: true, encoding: .utf8)

        let acked = AckedSet()
        let nacking = AtomicFlag(false)
        var simulatorConfiguration = SimulatorConfiguration(senderID: "123456789012", serverKey: "soak-key",
                                                            identity: try authority.issueServerIdentity())
        simulatorConfiguration.recordsEvents = false
        simulatorConfiguration.recordsAckLatencies = false
        simulatorConfiguration.onEvent = { event in
            if case .upstreamAcked(_, let messageID, _) = event, messageID.hasPrefix("soak-"), let number = Int(messageID.dropFirst(5)) {
                acked.insert(number)
            }
        }
        simulatorConfiguration.responder = { _ in
            nacking.value ? .nack(error: "SERVICE_UNAVAILABLE") : .ack(delay: .milliseconds(5))
        }
        let simulator = try CCSSimulator(configuration: simulatorConfiguration)
        defer { simulator.stop() }

        var configuration = try WorkerConfiguration.parse(arguments: [], environment: [
            "FCM_ENDPOINT": "127.0.0.1:\(simulator.port)", "FCM_SENDER_ID": "123456789012", "FCM_SERVER_KEY": "soak-key",
            "FCM_CA_FILE": caPath, "DATABASE_URL": url,
        ])
        configuration.connections = 2
        configuration.ackMode = ackMode
        configuration.spoolFile = folder + "/spool"
        configuration.databaseTimeout = .seconds(5)
        var handlers = UpstreamHandlers()
        handlers.register("store", StoreHandler())
        let committed = Atomic(0)
        let worker = FCMWorker(configuration: configuration, handlers: handlers, logger: Logger(label: "soak", minimumLevel: .error),
                               observer: { event in
                                   if case .committed(let handled, _, _) = event { committed.add(handled.count, ordering: .relaxed) }
                               })
        let running = Task { try await worker.run() }
        defer { running.cancel() }
        _ = try await simulator.waitForBoundSessions(2, timeout: .seconds(30))

        return try await PostgresConnection.withConnection(url) { observer in
            // The soak's own session survives the database fault: only the worker's end.
            let ownSession = Int(try await observer.query("SELECT pg_backend_pid()").first?.int(0) ?? 0)
            let started = ContinuousClock.now
            let end = started + .seconds(minutes * 60)
            var injected = 0
            var inserted = 0
            var samples: [Sample] = []
            var nextReport = started + .seconds(10)
            var nextFault = started + faultInterval
            var faultIndex = 0
            var nextInsert = started
            while ContinuousClock.now < end {
                let tick = ContinuousClock.now
                // Upstream: a tenth of a second's worth at a time.
                let due = Int((tick - started).seconds * Double(upstreamRate)) - injected
                if due > 0 {
                    simulator.injectUpstream((injected..<(injected + due)).map { number in
                        CCSSimulator.UpstreamRecord(messageID: "soak-\(number)", from: "soak-device-\(number % 500)", json: """
                            {"message_id":"soak-\(number)","from":"soak-device-\(number % 500)","category":"com.example.soak",\
                            "data":{"n":"\(number)","text":"soak payload"}}
                            """)
                    })
                    injected += due
                }
                // Downstream: a second's worth of outbox rows in one statement.
                if tick >= nextInsert {
                    try await retryingOnce {
                        _ = try await observer.execute("""
                            INSERT INTO downstream_messages (target, payload)
                            SELECT 'soak-token-' || (g % 2000), '{"data":{"text":"soak"}}'::jsonb FROM generate_series(1, $1) AS g
                            """, [.int(Int64(downstreamRate))])
                    }
                    inserted += downstreamRate
                    nextInsert = nextInsert + .seconds(1)
                }
                if tick >= nextFault {
                    await fault(faultIndex, simulator: simulator, nacking: nacking, database: observer, sparing: ownSession)
                    faultIndex += 1
                    nextFault = nextFault + faultInterval
                }
                if tick >= nextReport {
                    let sample = Self.sample(elapsed: (tick - started).seconds)
                    samples.append(sample)
                    let outbox = (try? await observer.query("SELECT count(*) FROM downstream_messages WHERE available_at IS NOT NULL"))?.first?.int(0)
                    // In journal and immediate mode a message may commit before its ack reaches CCS:
                    // "committed" may run ahead of "acked".
                    say(String(format: "%5.0f s  RSS %6.1f MB  fds %4d (pipes %d)  threads %3d  upstream injected %d acked %d committed %d  "
                               + "outbox inserted %d unfinished %@", sample.elapsed, sample.residentMegabytes, sample.descriptors, sample.pipes, sample.threads,
                               injected, acked.count, committed.load(ordering: .relaxed), inserted, outbox.map(String.init) ?? "?"))
                    nextReport = nextReport + .seconds(10)
                }
                try await Task.sleep(for: .milliseconds(100))
            }

            // Settle: no more load, no more faults.
            nacking.value = false
            say("load stopped; waiting for everything to settle")
            let settleLimit = ContinuousClock.now + .seconds(180)
            var stored = 0, unfinished = -1
            while ContinuousClock.now < settleLimit {
                stored = (try? await observer.query("SELECT count(*) FROM upstream_messages"))?.first?.int(0).map(Int.init) ?? stored
                unfinished = (try? await observer.query("SELECT count(*) FROM downstream_messages WHERE available_at IS NOT NULL"))?.first?.int(0).map(Int.init) ?? unfinished
                if stored >= injected && acked.count >= injected && unfinished == 0 { break }
                try await Task.sleep(for: .seconds(1))
            }
            let outcomes = try await observer.query("SELECT status, count(*) FROM downstream_messages GROUP BY 1 ORDER BY 1")
                .map { "\($0.string(0) ?? "?")=\($0.int(1) ?? 0)" }
            worker.requestShutdown()
            _ = try? await running.value

            var failures: [String] = []
            // Every message is acked in the end (CCS redelivers what was not), so every one must be stored.
            if acked.count < injected { failures.append("\(injected - acked.count) of \(injected) upstream messages never acked") }
            if stored < injected { failures.append("\(injected - stored) of \(injected) upstream messages not stored") }
            if unfinished != 0 { failures.append("\(unfinished) outbox row(s) never reached a final state") }
            // Growth is judged over at least two rounds of the faults: in one round, pools and
            // connections that fill up once (the first database fault reopens every session)
            // look the same as a leak would.
            let faultRound = faultInterval.seconds * Double(faults.count)
            let growthJudged = minutes * 60 >= 2 * faultRound
            if growthJudged {
                failures += Self.growth(in: samples)
            } else {
                say(String(format: "growth not judged: that needs a load of two rounds of the faults (%.0f s), this one ran %.0f s",
                           2 * faultRound, minutes * 60))
            }
            say("upstream: \(injected) injected, \(acked.count) acked, \(stored) stored; outbox: \(inserted) inserted, \(outcomes.joined(separator: ", "))")
            if let first = samples.first, let last = samples.last {
                say(String(format: "RSS %.1f → %.1f MB (peak %.1f), fds %d → %d, threads %d → %d over %.0f s",
                           first.residentMegabytes, last.residentMegabytes, samples.map(\.residentMegabytes).max() ?? 0,
                           first.descriptors, last.descriptors, first.threads, last.threads, last.elapsed))
            }
            if failures.isEmpty {
                say(growthJudged ? "soak passed: nothing lost, nothing grew without bound" : "soak passed: nothing lost (growth not judged)")
                return true
            }
            for failure in failures { say("SOAK FAILED: \(failure)") }
            return false
        }
    }

    /// Runs `body`, once more after a second if it fails (a terminated session is replaced).
    private func retryingOnce(_ body: () async throws -> Void) async throws {
        do { try await body() } catch {
            try await Task.sleep(for: .seconds(1))
            try await body()
        }
    }

    /// The `index`th fault of the rotation.
    private func fault(_ index: Int, simulator: CCSSimulator, nacking: AtomicFlag, database: PostgresConnection, sparing ownSession: Int) async {
        let sessions = simulator.boundSessions
        switch faults[index % faults.count] {
        case .drop:
            if let session = sessions.last { simulator.drop(session: session) }
            say("fault: dropped CCS session \(sessions.last.map(String.init) ?? "-")")
        case .drain:
            if let session = sessions.first { simulator.sendConnectionDraining(session: session) }
            say("fault: CCS drains session \(sessions.first.map(String.init) ?? "-")")
        case .nack:
            nacking.value = true
            say("fault: SERVICE_UNAVAILABLE nacks for 3 s")
            try? await Task.sleep(for: .seconds(3))
            nacking.value = false
        case .database:
            // What a database restart does to its clients: every session of theirs ends.
            let ended = try? await database.query("""
                SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                WHERE datname = current_database() AND pid <> $1 AND backend_type = 'client backend'
                """, [.int(Int64(ownSession))]).first?.int(0)
            say("fault: \(ended.map(String.init) ?? "?") PostgreSQL session(s) terminated")
        }
    }

    /// Fails when RSS, descriptors or threads keep growing: after a warm-up (the first
    /// sixth), the last third's median against the first third's. A process in a steady
    /// state keeps its descriptors and threads (reconnects replace what they close), so
    /// their allowance is small; memory settles more slowly.
    static func growth(in samples: [Sample]) -> [String] {
        guard samples.count >= 9 else { return [] }
        let settled = Array(samples.dropFirst(samples.count / 6))
        let early = settled.prefix(settled.count / 3), late = settled.suffix(settled.count / 3)
        func median(_ part: ArraySlice<Sample>, _ value: (Sample) -> Double) -> Double {
            let sorted = part.map(value).sorted()
            return sorted[sorted.count / 2]
        }
        var failures: [String] = []
        let rss = (median(early, \.residentMegabytes), median(late, \.residentMegabytes))
        if rss.1 > rss.0 * 1.25 + 16 { failures.append(String(format: "RSS grew from a median of %.1f MB to %.1f MB", rss.0, rss.1)) }
        let fds = (median(early) { Double($0.descriptors) }, median(late) { Double($0.descriptors) })
        if fds.1 > fds.0 + 6 { failures.append("open descriptors grew from a median of \(Int(fds.0)) to \(Int(fds.1))") }
        let threads = (median(early) { Double($0.threads) }, median(late) { Double($0.threads) })
        if threads.1 > threads.0 + 4 { failures.append("threads grew from a median of \(Int(threads.0)) to \(Int(threads.1))") }
        return failures
    }

    /// This process's figures now.
    static func sample(elapsed: Double) -> Sample {
        let status = (try? String(contentsOfFile: "/proc/self/status", encoding: .utf8)) ?? ""
        func field(_ name: String) -> Int {
            status.split(separator: "\n").first { $0.hasPrefix(name + ":") }?
                .split(whereSeparator: { $0 == " " || $0 == "\t" }).dropFirst().first.flatMap { Int($0) } ?? -1
        }
        let descriptors = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
        let pipes = descriptors.count { name in
            (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/" + name))?.hasPrefix("pipe:") ?? false
        }
        return Sample(elapsed: elapsed, residentMegabytes: Double(field("VmRSS")) / 1024, descriptors: descriptors.count,
                      pipes: pipes, threads: field("Threads"))
    }
}
