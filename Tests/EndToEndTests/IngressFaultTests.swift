import FCM
import Foundation
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
}
