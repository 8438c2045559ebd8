import FCM
import Foundation
import Postgres
import Runtime
import Simulator
import Testing
import Worker
import TestSupport

/// Database faults through a TCP proxy the test controls: nothing acked is lost, and the
/// worker recovers without a restart.
@Suite struct DatabaseFaultTests {
    /// A worker configuration whose database connections go through a fault proxy.
    private func proxied(_ ccs: TestCCS, _ database: TestDatabase) throws -> (WorkerConfiguration, FaultProxy) {
        try proxiedWorker(ccs, database)
    }

    /// An outage's log says how many messages wait in all (it once named the one batch that
    /// failed: "1 message(s) wait" with thousands queued), and says when the database is back.
    @Test func anOutageSaysHowManyMessagesWaitAndWhenTheDatabaseIsBack() async throws {
        let ccs = try TestCCS(configure: { $0.recordsEvents = true })
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let (configuration, proxy) = try proxied(ccs, database)
        defer { proxy.stop() }
        let (_, task, lines) = launchLoggedWorker(configuration)
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        ccs.simulator.injectUpstream(from: "d0", messageID: "first")
        await database.waitForRows(in: "upstream_messages", count: 1, within: .seconds(20))
        proxy.set(.refuse)
        proxy.cut()
        for index in 0..<200 { ccs.simulator.injectUpstream(from: "d\(index % 20)", messageID: "during-\(index)") }
        try await ccs.simulator.wait(for: "every ack", timeout: .seconds(30)) { Set($0.acked).count >= 201 }
        // Every lane has taken its batch: what waits is the batches and the queues.
        try await waitUntil("an outage line counting what waits", within: .seconds(20)) {
            lines.withLock { $0 }.contains { line in
                guard line.contains("database unavailable"), let range = line.range(of: #"; (\d+) message\(s\) wait"#, options: .regularExpression) else {
                    return false
                }
                let count = Int(line[range].dropFirst(2).prefix { $0.isNumber }) ?? 0
                return count > 20
            }
        }
        proxy.set(.pass)
        await database.waitForRows(in: "upstream_messages", count: 201, within: .seconds(30))
        #expect(lines.withLock { $0 }.contains { $0.contains("the database is reachable again") })
    }

    @Test func stalledConnectionsAreReplacedAndEverythingAckedIsStoredWithoutARestart() async throws {
        let ccs = try TestCCS(configure: { $0.recordsEvents = true })
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let (configuration, proxy) = try proxied(ccs, database)
        defer { proxy.stop() }
        let (task, events) = startWorker(configuration)
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        for index in 0..<500 { ccs.simulator.injectUpstream(from: "d\(index % 20)", messageID: "before-\(index)") }
        await database.waitForRows(in: "upstream_messages", count: 500, within: .seconds(20))
        // The open connections go silent (a failover behind a load balancer); new ones work.
        proxy.set(.stall(newConnectionsWork: true))
        let stalledAt = ContinuousClock.now
        for index in 0..<2000 { ccs.simulator.injectUpstream(from: "d\(index % 20)", messageID: "during-\(index)") }
        try await ccs.simulator.wait(for: "every ack", timeout: .seconds(30)) { Set($0.acked).count >= 2500 }
        await database.waitForRows(in: "upstream_messages", count: 2500, within: .seconds(30))
        #expect(try await database.count("upstream_messages") == 2500)
        let recovered = ContinuousClock.now - stalledAt
        print("after the database connections stalled (--database-timeout 2), all 2,000 acked were stored \(recovered) later")
        // The deadline (2 s) plus a reconnect, with room for a busy test machine.
        #expect(recovered < .seconds(15), "stored \(recovered) after the stall")
        #expect(events.all.contains { if case .databaseUnavailable(let reason) = $0 { reason.contains("timeout") } else { false } })
        // The worker is still running: more messages are stored as usual.
        ccs.simulator.injectUpstream(from: "d0", messageID: "after")
        await database.waitForRows(in: "upstream_messages", count: 2501, within: .seconds(10))
        #expect(try await database.count("upstream_messages") == 2501)
        #expect(ccs.simulator.violations.isEmpty)
    }

    @Test func aLongOutageUnderLoadKeepsTheCCSConnectionUpAndLosesNothing() async throws {
        let ccs = try TestCCS(configure: { $0.recordsEvents = true })
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        var (configuration, proxy) = try proxied(ccs, database)
        defer { proxy.stop() }
        // CCS is pinged after 1 s of silence and presumed dead 1 s later: an outage of 8 s
        // is many times that (the same as 90 s against the default 60 + 15 s).
        configuration.pingInterval = .seconds(1)
        configuration.pingTimeout = .seconds(1)
        configuration.pipeline.queueCapacity = 50
        let (task, events) = startWorker(configuration)
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        try await events.wait(for: "the worker's side of the session") { events in
            events.contains { if case .connected = $0 { true } else { false } }
        }
        proxy.set(.refuse)
        proxy.cut()
        for index in 0..<3000 { ccs.simulator.injectUpstream(from: "d\(index % 10)", messageID: "o\(index)") }
        // Reading pauses once the lanes are full; CCS stops at 100 unacked.
        try await ccs.simulator.wait(for: "CCS's window to fill", timeout: .seconds(30)) { events in
            let delivered = events.count { if case .upstreamDelivered = $0 { true } else { false } }
            return delivered - events.acked.count >= 100
        }
        // What is checked is that nothing happens: no ping goes out while reading is paused,
        // so no event marks the time. A ping that did would time out (and the connection
        // drop) 2 s after the silence began; the window is four times that.
        try await Task.sleep(for: .seconds(8))
        #expect(!events.all.contains { if case .disconnected = $0 { true } else { false } }, "the paused connection was dropped")
        proxy.set(.pass)
        try await ccs.simulator.wait(for: "every ack", timeout: .seconds(60)) { Set($0.acked).count >= 3000 }
        await database.waitForRows(in: "upstream_messages", count: 3000, within: .seconds(30))
        #expect(try await database.count("upstream_messages") == 3000)
        #expect(!events.all.contains { if case .disconnected = $0 { true } else { false } })
        #expect(ccs.simulator.violations.isEmpty)
    }
}

/// The worker as a process under SIGTERM while the database is down or hung: it exits
/// within the shutdown timeout plus a few seconds, and a restart loses nothing acked.
@Suite struct ShutdownDuringDatabaseFaultTests {
    private func run(_ ccs: TestCCS, databaseURL: String, spool: String, shutdownTimeout: Int = 2) throws -> (Process, Pipe) {
        // One lane: its queue (2,048) fills with fewer messages.
        try WorkerProcess.start(ccs, databaseURL: databaseURL, spool: spool,
                                ["--shutdown-timeout", "\(shutdownTimeout)", "--database-timeout", "2", "--concurrency", "1"])
    }

    private func terminate(_ process: Process, limit: Duration) async throws -> Duration {
        try await WorkerProcess.terminate(process, limit: limit)
    }

    /// A database behind a fault proxy, for a worker process.
    private func proxiedDatabase() async throws -> (TestDatabase, FaultProxy, url: String, spool: String) {
        let database = try await TestDatabase.make()
        let proxy = try FaultProxy(targetPort: URLComponents(string: try TestDatabase.baseURL)!.port!)
        let spool = FileManager.default.temporaryDirectory.appendingPathComponent("spool-\(UUID())").path
        return (database, proxy, proxy.url(replacingPortIn: database.url), spool)
    }

    @Test func aSecondSIGTERMSkipsTheWaitingAndStillSpoolsEverythingAcked() async throws {
        let ccs = try TestCCS(configure: { $0.recordsEvents = true })
        defer { ccs.simulator.stop() }
        let (database, proxy, url, spool) = try await proxiedDatabase()
        defer { proxy.stop() }
        let (worker, errors) = try run(ccs, databaseURL: url, spool: spool, shutdownTimeout: 60)
        try await ccs.simulator.waitForBoundSessions(1)
        proxy.set(.stall(newConnectionsWork: false))
        for index in 0..<300 { ccs.simulator.injectUpstream(from: "d\(index % 20)", messageID: "u\(index)") }
        try await ccs.simulator.wait(for: "every ack", timeout: .seconds(30)) { Set($0.acked).count >= 300 }
        kill(worker.processIdentifier, SIGTERM)
        try await Task.sleep(for: .milliseconds(500))
        let took = try await terminate(worker, limit: .seconds(10))
        let log = String(decoding: await readToEnd(errors.fileHandleForReading), as: UTF8.self)
        print("an urgent shutdown (a second SIGTERM 0.5 s after the first) took \(took) after it (--shutdown-timeout 60)")
        #expect(worker.terminationStatus == 0, "\(log.suffix(2000))")
        #expect(took < .seconds(5), "\(log.suffix(3000))")
        #expect(log.contains("received SIGTERM again"))
        #expect(FileManager.default.fileExists(atPath: spool))
        // A restart with the database back stores everything that was acked.
        proxy.set(.pass)
        let acked = Set(ccs.simulator.events.acked)
        let (second, _) = try run(ccs, databaseURL: url, spool: spool)
        defer { if second.isRunning { second.terminate() } }
        await database.waitForRows(in: "upstream_messages", count: 300, within: .seconds(30))
        _ = try await terminate(second, limit: .seconds(20))
        let lost = acked.subtracting(try await database.storedMessageIDs())
        #expect(lost.isEmpty, "\(lost.count) acked message(s) lost, e.g. \(lost.prefix(5))")
    }

    @Test(arguments: ["refused", "hung"])
    func sigtermWithTheDatabaseDownAndFullQueuesExitsInTimeAndARestartLosesNothing(fault: String) async throws {
        let ccs = try TestCCS(configure: { $0.recordsEvents = true })
        defer { ccs.simulator.stop() }
        let (database, proxy, url, spool) = try await proxiedDatabase()
        defer { proxy.stop() }
        let (first, firstErrors) = try run(ccs, databaseURL: url, spool: spool)
        try await ccs.simulator.waitForBoundSessions(1)
        for index in 0..<200 { ccs.simulator.injectUpstream(from: "d\(index % 50)", messageID: "x\(index)") }
        try await ccs.simulator.wait(for: "the first acks", timeout: .seconds(30)) { Set($0.acked).count >= 200 }
        if fault == "refused" {
            proxy.set(.refuse)
            proxy.cut()
        } else {
            // A partition: open connections go silent and new ones hang too.
            proxy.set(.stall(newConnectionsWork: false))
        }
        for index in 200..<5_000 { ccs.simulator.injectUpstream(from: "d\(index % 50)", messageID: "x\(index)") }
        // Acking stops once the queues are full and reading pauses.
        var last = -1
        while true {
            try await Task.sleep(for: .seconds(1))
            let acked = Set(ccs.simulator.events.acked).count
            if acked == last { break }
            last = acked
        }
        let took = try await terminate(first, limit: .seconds(12))
        print("shutdown with the database \(fault) and full queues took \(took) (--shutdown-timeout 2)")
        let log = String(decoding: await readToEnd(firstErrors.fileHandleForReading), as: UTF8.self)
        #expect(first.terminationStatus == 0, "\(log.suffix(3000))")
        #expect(took < .seconds(9), "exit took \(took) with --shutdown-timeout 2: \(log.suffix(4000))")
        let ackedBeforeRestart = Set(ccs.simulator.events.acked)
        #expect(ackedBeforeRestart.count > 1000)
        #expect(FileManager.default.fileExists(atPath: spool), "the acked, uncommitted messages were spooled")

        // The database is back; a restart replays the spool, CCS redelivers the rest.
        proxy.set(.pass)
        let (second, secondErrors) = try run(ccs, databaseURL: url, spool: spool)
        defer { if second.isRunning { second.terminate() } }
        try await ccs.simulator.wait(for: "every message acked", timeout: .seconds(90)) { Set($0.acked).count >= 5_000 }
        await database.waitForRows(in: "upstream_messages", count: 5_000, within: .seconds(60))
        _ = try await terminate(second, limit: .seconds(20))
        let secondLog = String(decoding: await readToEnd(secondErrors.fileHandleForReading), as: UTF8.self)
        let lost = ackedBeforeRestart.subtracting(try await database.storedMessageIDs())
        #expect(lost.isEmpty, "\(lost.count) acked message(s) lost, e.g. \(lost.prefix(5)); \(secondLog.suffix(2000))")
        #expect(try await database.count("upstream_messages") == 5_000)
    }
}

/// Errors that are the database's state, not the message's (too many connections, a server
/// shutting down, disk full, a read-only server), raised inside a handler's transaction:
/// the batch waits as in an outage and is tried again, and no attempt of the message is
/// spent on them (each once consumed an attempt: two of them dead-lettered a message).
@Suite struct DatabaseStateErrorTests {
    /// Raises `states` in order, one per run, then stores the message.
    private struct FailingWithState: UpstreamHandler {
        let states: [String]
        let runs = BlockingLock(0)

        func handle(_ message: UpstreamMessage, in context: HandlerContext) async throws {
            let run = runs.withLock { runs in
                defer { runs += 1 }
                return runs
            }
            if run < states.count {
                _ = try await context.query("DO $$ BEGIN RAISE EXCEPTION 'the database''s state' USING ERRCODE = '\(states[run])'; END $$")
            }
            context.execute("INSERT INTO upstream_messages (message_id, from_token, category, received_at) VALUES ($1, $2, $3, now())",
                            [.text(message.messageID), .text(message.from), .text(message.category ?? "")])
        }
    }

    @Test func theDatabasesStateNeverSpendsAMessagesAttempts() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        var configuration = try ccs.worker(database: database)
        configuration.maxAttempts = 2
        let handler = FailingWithState(states: ["53300", "57P03", "53100", "25006"])
        var handlers = UpstreamHandlers()
        handlers.register("state", handler)
        let (task, _) = startWorker(configuration, handlers: handlers)
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        ccs.simulator.injectUpstream(from: "phone-1", messageID: "waits-out-the-state")
        await database.waitForRows(in: "upstream_messages", count: 1, within: .seconds(30))
        #expect(try await database.count("dead_letters") == 0)
        #expect(handler.runs.withLock { $0 } == 5)
    }
}

/// The start and its database: what retrying cannot fix stops the worker with one line
/// (status 2 from the command line), and while the database is only away, the probes and
/// metrics are served from the first moment and say what the worker waits for.
@Suite struct DatabaseAtStartTests {
    @Test(arguments: ["a database that does not exist", "a user that does not exist"])
    func whatRetryingCannotFixStopsTheStartWithOneLine(case: String) async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        var components = try #require(URLComponents(string: database.url))
        if `case`.hasPrefix("a database") { components.path = "/no_such_database" } else { components.user = "no_such_user" }
        var configuration = try ccs.worker(database: database)
        configuration.databaseURL = components.string
        let (task, _) = startWorker(configuration)
        // It used to retry for ever: stopped after 15 s, it fails the test.
        let watchdog = Task {
            try await Task.sleep(for: .seconds(15))
            task.cancel()
        }
        defer { watchdog.cancel() }
        do {
            try await task.value
            Issue.record("the worker ran until stopped")
        } catch let error as ConfigurationError {
            #expect(error.description.contains("retrying cannot fix it") && error.description.contains("does not exist"), "\(error)")
        }
    }

    @Test func whileTheDatabaseIsAwayAtStartTheProbesSayWhatTheWorkerWaitsFor() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        var (configuration, proxy) = try proxiedWorker(ccs, database)
        defer { proxy.stop() }
        proxy.set(.refuse)
        configuration.metricsAddress = "127.0.0.1:0"
        let (task, events) = startWorker(configuration)
        defer { task.cancel() }
        try await events.wait(for: "the metrics listener") { $0.contains { if case .serving = $0 { true } else { false } } }
        let port = try #require(events.all.compactMap { if case .serving(let port) = $0 { port } else { nil } }.first)
        try await waitUntil("readiness says the start waits for the database", within: .seconds(20)) {
            guard let (status, body) = try? await httpGet(port: port, path: "/readyz") else { return false }
            return status == 503 && body.contains("waiting for the database")
        }
        let page = try await httpGet(port: port, path: "/metrics")
        #expect(page.status == 200 && page.body.contains("fcm_worker_database_reachable 0") && page.body.contains("fcm_worker_ready 0"))
        #expect(try await httpGet(port: port, path: "/healthz").status == 200)
        // The database comes: the worker starts and becomes ready.
        proxy.set(.pass)
        try await ccs.simulator.waitForBoundSessions(1)
        try await waitUntil("ready", within: .seconds(20)) { (try? await httpGet(port: port, path: "/readyz"))?.status == 200 }
    }

    /// Stopped while the database was still away at start: a graceful stop's status, and a
    /// line saying the worker never started (a plain "stopped" misled).
    @Test func aStopBeforeTheStartSaysTheWorkerNeverStarted() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let (configuration, proxy) = try proxiedWorker(ccs, database)
        defer { proxy.stop() }
        proxy.set(.refuse)
        let (worker, task, lines) = launchLoggedWorker(configuration)
        try await waitUntil("the start waits for the database", within: .seconds(20)) {
            lines.withLock { $0 }.contains { $0.contains("database unavailable at start") }
        }
        worker.requestShutdown()
        try await task.value
        #expect(lines.withLock { $0 }.contains { $0.contains("stopped before the worker started") && $0.contains("waiting for the database") })
    }

}
