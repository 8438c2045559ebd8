import FCM
import Foundation
import Handlers
import Ingress
import Runtime
import Simulator
import Synchronization
import Testing
import Transport
import Worker
import TestSupport

/// The HTTPS ingress under faults: what it answered 200 survives what its ack mode says, and
/// what it cannot promise it refuses with 503.
@Suite struct IngressFaultTests {
    /// Posts `count` messages from `devices` senders, several at once, until `stop` says so;
    /// returns the client ids answered 200.
    private static func post(_ count: Int, devices: Int, port: Int, setup: IngressSetup, answered: BlockingLock<[String]>) async throws {
        let client = try HTTPSClient(host: "127.0.0.1", port: port, trust: .caPEM(setup.ccs.authority.rootCertificatePEM),
                                     maximumConnections: devices, timeout: .seconds(20))
        let tokens = try (0..<devices).map { try setup.idToken(uid: "device-\($0)") }
        await withTaskGroup(of: Void.self) { group in
            for device in 0..<devices {
                group.addTask {
                    for index in stride(from: device, to: count, by: devices) {
                        let body = #"{"message_id":"k-\#(index)","token":"token-\#(device)","data":{"n":"\#(index)"}}"#
                        guard let answer = try? await client.postMessage(body, token: tokens[device]) else { return }
                        if answer.status == 200 { answered.withLock { $0.append("k-\(index)") } }
                    }
                }
            }
        }
    }

    @Test(arguments: [CCSAckMode.journal, .durable])
    func killDashNineLosesNothingAnswered(mode: CCSAckMode) async throws {
        let setup = try await IngressSetup(ackMode: mode)
        defer { setup.stop() }
        let spool = setup.folder + "/spool"
        let port = try freePort()
        let (first, errors) = try WorkerProcess.start(setup.ccs, databaseURL: setup.database.url, spool: spool, setup.processFlags(port: port))
        defer { if first.isRunning { kill(first.processIdentifier, SIGKILL) } }
        let log = Task { String(decoding: await readToEnd(errors.fileHandleForReading), as: UTF8.self) }
        let probe = try HTTPSClient(host: "127.0.0.1", port: port, trust: .caPEM(setup.ccs.authority.rootCertificatePEM), timeout: .seconds(2))
        let probeToken = try setup.idToken(uid: "probe")
        try await waitUntil("the ingress answers", within: .seconds(30)) {
            (try? await probe.postMessage(#"{"message_id":"probe","token":"t","data":{}}"#, token: probeToken))?.status == 200
        }
        let answered = BlockingLock<[String]>([])
        let posting = Task { try await Self.post(3000, devices: 8, port: port, setup: setup, answered: answered) }
        do {
            try await waitUntil("some answers", within: .seconds(60)) { answered.withLock { $0.count } >= 300 }
        } catch {
            kill(first.processIdentifier, SIGKILL)
            Issue.record("\(error); the worker's log: \(await log.value.suffix(3000))")
            return
        }
        kill(first.processIdentifier, SIGKILL)
        _ = await exitStatus(of: first)
        try await posting.value
        let answeredBeforeKill = Set(answered.withLock { $0 })
        #expect(!answeredBeforeKill.isEmpty)
        if mode == .durable {
            // Answered only once committed: every one is in the database already.
            let stored = try await Self.storedClientIDs(setup.database)
            #expect(answeredBeforeKill.subtracting(stored).isEmpty, "\(answeredBeforeKill.subtracting(stored).count) answered but not stored")
        }
        // The next start replays the journal (journal mode); nothing answered is missing.
        let (second, _) = try WorkerProcess.start(setup.ccs, databaseURL: setup.database.url, spool: spool, setup.processFlags(port: port))
        defer { if second.isRunning { second.terminate() } }
        var missing = answeredBeforeKill
        let deadline = ContinuousClock.now + .seconds(60)
        while !missing.isEmpty && ContinuousClock.now < deadline {
            missing.subtract(try await Self.storedClientIDs(setup.database))
            if !missing.isEmpty { try await Task.sleep(for: .milliseconds(100)) }
        }
        #expect(missing.isEmpty, "\(missing.count) message(s) answered 200 before kill -9 are lost, e.g. \(missing.prefix(5))")
        kill(second.processIdentifier, SIGTERM)
        _ = await exitStatus(of: second)
        // Each stored once (the id is the key of the table's records).
        #expect(try await setup.database.count("upstream_messages") == Set(try await Self.storedClientIDs(setup.database)).count)
    }

    private static func storedClientIDs(_ database: TestDatabase) async throws -> Set<String> {
        Set(try await database.query("SELECT message_id FROM upstream_messages").compactMap { row in
            row.string(0).flatMap { id in id.split(separator: ":").last.map(String.init) }
        })
    }

    @Test func inDurableModeADatabaseOutageIsAnswered503AndWhatWaitedIsAnsweredOnceBack() async throws {
        let setup = try await IngressSetup(ackMode: .durable, dedicated: true)
        defer { setup.stop() }
        let (task, _, client) = try await setup.start()
        defer { task.cancel() }
        let token = try setup.idToken(uid: "outage")
        #expect(try await client.postMessage(#"{"message_id":"before","token":"t","data":{}}"#, token: token).status == 200)
        try await TestDatabase.cutOff(setup.databaseName!)
        // The first post after the cut waits for its commit; once the pipeline knows the
        // database is down, new posts are refused at once.
        let waiting = Task { try await client.postMessage(#"{"message_id":"waited","token":"t","data":{}}"#, token: token) }
        // Probes that give up after a second: one admitted before the pipeline saw the
        // outage waits for its commit, like the first.
        let port = client.port
        let probe = try HTTPSClient(host: "127.0.0.1", port: port, trust: .caPEM(setup.ccs.authority.rootCertificatePEM), timeout: .seconds(1))
        var refusal: HTTPSClient.Response?
        let deadline = ContinuousClock.now + .seconds(30)
        while refusal == nil && ContinuousClock.now < deadline {
            if let answer = try? await probe.postMessage(#"{"message_id":"during","token":"t","data":{}}"#, token: token), answer.status == 503 {
                refusal = answer
            } else {
                try await Task.sleep(for: .milliseconds(200))
            }
        }
        #expect(refusal?.body.contains("database_unavailable") == true, "\(String(describing: refusal?.body))")
        #expect(refusal?.headers["retry-after"] != nil)
        try await TestDatabase.restore(setup.databaseName!)
        let answer = try await waiting.value
        #expect(answer.status == 200, "\(answer.body)")
        #expect(try await setup.database.count("upstream_messages", where: "message_id LIKE '%:waited'") == 1)
    }

    @Test func fullLanesAreAnswered503AndNothingAnsweredIsLost() async throws {
        var setup = try await IngressSetup(ackMode: .immediate, dedicated: true)
        setup.configuration.pipeline.queueCapacity = 20
        setup.configuration.concurrency = 1
        // Each request past the lanes waits this long for room before its 503.
        setup.configuration.ingressSettings.queueWait = .milliseconds(200)
        setup.configuration.ingressSettings.rateBurst = 100_000
        setup.configuration.ingressSettings.ratePerSecond = 100_000
        defer { setup.stop() }
        let (task, _, client) = try await setup.start()
        defer { task.cancel() }
        try await TestDatabase.cutOff(setup.databaseName!)
        let token = try setup.idToken(uid: "flood")
        var accepted: [String] = []
        var overloaded: HTTPSClient.Response?
        for index in 0..<200 where overloaded == nil {
            let answer = try await client.postMessage(#"{"message_id":"f-\#(index)","token":"t","data":{}}"#, token: token)
            if answer.status == 200 { accepted.append("f-\(index)") } else if answer.status == 503 { overloaded = answer }
        }
        #expect(overloaded?.body.contains("overloaded") == true, "\(String(describing: overloaded?.body))")
        #expect(accepted.count >= 20 && accepted.count < 200)
        try await TestDatabase.restore(setup.databaseName!)
        await setup.database.waitForRows(in: "upstream_messages", count: accepted.count, within: .seconds(30))
        #expect(try await setup.database.count("upstream_messages") == accepted.count)
    }

    /// A burst past the lanes' room waits for room instead of being refused: every request
    /// is answered 200 once the handlers move again, in each ack mode, and nothing is lost.
    @Test(arguments: [CCSAckMode.immediate, .journal, .durable])
    func aBurstPastTheLanesWaitsForRoomAndIsAnswered200(mode: CCSAckMode) async throws {
        var setup = try await IngressSetup(ackMode: mode)
        setup.configuration.pipeline.queueCapacity = 10
        setup.configuration.concurrency = 1
        setup.configuration.ingressSettings.queueWait = .seconds(60)
        setup.configuration.ingressSettings.rateBurst = 1000
        setup.configuration.metricsAddress = "127.0.0.1:0"
        defer { setup.stop() }
        // The gate holds the lane's first batch, so the lane fills behind it.
        let gate = GateHandler()
        var handlers = UpstreamHandlers()
        handlers.register("gate", gate)
        handlers.register("store", StoreHandler())
        let (task, events, port) = try await setup.serve(handlers: handlers)
        let metricsPort = try #require(events.all.compactMap { if case .serving(let port) = $0 { port } else { nil } }.first)
        defer { task.cancel() }
        let client = try HTTP2Client(host: "127.0.0.1", port: port, trust: .caPEM(setup.ccs.authority.rootCertificatePEM), maximumConnections: 1)
        let token = try setup.idToken(uid: "burst-\(mode.rawValue)")
        @Sendable func post(_ indices: Range<Int>) -> Task<[Int], any Error> {
            Task {
                try await withThrowingTaskGroup(of: Int.self) { group in
                    for index in indices {
                        group.addTask {
                            let body = #"{"message_id":"b-\#(mode.rawValue)-\#(index)","token":"t","data":{"n":"\#(index)"}}"#
                            return try await client.send(method: "POST", path: "/v1/messages",
                                                         headers: ["content-type": "application/json", "authorization": "Bearer " + token],
                                                         body: Array(body.utf8)).status
                        }
                    }
                    var statuses: [Int] = []
                    for try await status in group { statuses.append(status) }
                    return statuses
                }
            }
        }
        func metric(_ name: String) async -> Int? {
            let page = (try? await httpGet(port: metricsPort, path: "/metrics"))?.body ?? ""
            guard let line = page.split(separator: "\n").first(where: { $0.hasPrefix(name + " ") }) else { return nil }
            return Double(line.dropFirst(name.count + 1)).map { Int($0) }
        }
        // One message the handler holds; then the lane's queue fills (one read may put more
        // than its capacity there); then the rest find it full (as many as the lanes hold may
        // wait).
        let first = post(0..<1)
        try await waitUntil("the handler holds the first message") { gate.entered.load(ordering: .relaxed) == 1 }
        let filling = post(1..<11)
        try await waitUntil("the lane's queue is full", within: .seconds(30)) { await metric("fcm_worker_upstream_queue_depth") ?? 0 >= 10 }
        let rest = post(11..<20)
        try await waitUntil("the rest wait for room", within: .seconds(30)) { await metric("fcm_worker_ingress_waiting_requests") ?? 0 > 0 }
        gate.open.store(true, ordering: .relaxed)
        let answered = try await first.value + filling.value + rest.value
        #expect(answered.count == 20)
        #expect(answered.allSatisfy { $0 == 200 }, "\(answered.sorted())")
        try await waitUntil("the 20 messages stored", within: .seconds(30)) {
            try await setup.database.count("upstream_messages", where: "message_id LIKE '%:b-\(mode.rawValue)-%'") == 20
        }
    }
}
