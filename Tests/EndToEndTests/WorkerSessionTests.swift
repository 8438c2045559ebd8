import FCM
import Foundation
import Handlers
import Simulator
import Testing
import Worker
import XMPP

/// `FCMWorker` (the `run` command's engine) against the simulator.
@Suite struct WorkerSessionTests {
    @Test func everyUpstreamMessageAndReceiptIsAckedOnceOnItsOwnConnection() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        var configuration = try ccs.worker(database: await TestDatabase.make())
        configuration.connections = 3
        let (task, _) = startWorker(configuration)
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(3)
        var ids: [String] = []
        for index in 0..<300 {
            ids.append(ccs.simulator.injectUpstream(from: "device-\(index % 7)", data: ["n": .string("\(index)")]))
        }
        ccs.simulator.injectRaw(
            json: "{\"message_type\":\"receipt\",\"message_id\":\"dr2:r1\",\"from\":\"gcm.googleapis.com\",\"category\":\"c\",\"data\":{\"message_status\":\"MESSAGE_SENT_TO_DEVICE\"}}",
            messageID: "dr2:r1", from: "gcm.googleapis.com")
        try await ccs.simulator.wait(for: "301 acks") { $0.acked.count >= 301 }
        let events = ccs.simulator.events
        #expect(Set(events.acked) == Set(ids + ["dr2:r1"]))
        #expect(events.acked.count == 301)
        // Spread over the connections, each acked where it arrived (the simulator checks).
        let sessionsUsed = Set(events.compactMap { if case .upstreamAcked(let session, _, _) = $0 { session } else { nil } })
        #expect(sessionsUsed.count > 1)
        #expect(events.violations.isEmpty, "\(events.violations)")
    }

    @Test func aDropLeadsToAReconnectWithinTheBackoffAndUnackedMessagesAreRedelivered() async throws {
        let ccs = try TestCCS(configure: { $0.maxUnackedUpstream = 1000 })
        defer { ccs.simulator.stop() }
        var configuration = try ccs.worker(database: await TestDatabase.make())
        configuration.reconnectBase = .milliseconds(300)
        let (task, events) = startWorker(configuration)
        defer { task.cancel() }
        let first = try await ccs.simulator.waitForBoundSessions(1)[0]
        ccs.simulator.injectUpstream(messageID: "before-drop")
        try await ccs.simulator.wait(for: "the first ack") { $0.acked.contains("before-drop") }

        ccs.simulator.drop(session: first)
        // Messages sent while no connection is up wait in CCS and arrive after the reconnect.
        ccs.simulator.injectUpstream(messageID: "during-outage")
        try await ccs.simulator.wait(for: "a second session") { $0.openBoundSessions.contains { $0 != first } }
        try await ccs.simulator.wait(for: "the outage message's ack") { $0.acked.contains("during-outage") }
        try await events.wait(for: "the reconnect to be recorded") { events in
            events.contains { if case .reconnectScheduled = $0 { true } else { false } }
        }
        let delays = events.all.compactMap { if case .reconnectScheduled(_, let delay) = $0 { delay } else { nil } }
        #expect(delays.count == 1)
        #expect(delays.allSatisfy { $0 >= .zero && $0 <= .milliseconds(300) }, "\(delays)")
        #expect(ccs.simulator.violations.isEmpty)
    }

    @Test func refusedCredentialsStopTheWorkerWithoutRetrying() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let (task, _) = startWorker(try ccs.worker(serverKey: "not-the-key", database: await TestDatabase.make()))
        do {
            try await task.value
            Issue.record("the worker ran with a refused key")
        } catch let error as XMPPError {
            #expect(error == .authenticationRefused(condition: "not-authorized"))
        }
        let refusals = ccs.simulator.events.count { if case .authenticationRefused = $0 { true } else { false } }
        #expect(refusals == 1)
    }

    @Test func anUnknownXMPPDomainIsAConfigurationErrorNotAReasonToReconnect() async throws {
        let ccs = try TestCCS(configure: { $0.recordsEvents = true })
        defer { ccs.simulator.stop() }
        var configuration = try ccs.worker(database: await TestDatabase.make())
        configuration.xmppDomain = "wrong.example.com"
        let (task, _) = startWorker(configuration)
        let started = ContinuousClock.now
        do {
            try await task.value
            Issue.record("the worker ran with a domain CCS does not serve")
        } catch let error as XMPPError {
            #expect(error.isConfigurationError, "\(error)")
            guard case .streamError("host-unknown", _) = error else { Issue.record("\(error)"); return }
        }
        #expect(ContinuousClock.now - started < .seconds(60), "a hang detector, not a speed assertion")
        #expect(ccs.simulator.events.count { if case .connected = $0 { true } else { false } } == 1, "no reconnect")
    }

    @Test(arguments: ["gcm.googleapis.com", "fcm.googleapis.com"])
    func publishedClientsDomainsAndBareSenderIDsAreAccepted(domain: String) async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        for identity in ["\(TestCCS.senderID)@\(domain)", TestCCS.senderID] {
            var client = ccs.client()
            client.credentials = .init(domain: domain, authenticationIdentity: identity, password: TestCCS.serverKey)
            let (connection, _) = try await ccs.connect(client)
            await connection.close()
        }
    }

    @Test func drainingIsFollowedByAnImmediateNewConnection() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        var configuration = try ccs.worker(database: await TestDatabase.make())
        configuration.reconnectBase = .seconds(30)  // a backoff would show as a timeout here
        let (task, events) = startWorker(configuration)
        defer { task.cancel() }
        // The session the worker holds (the simulator counts one bound when it sends the
        // bind result; CI has seen a session bound there that the worker then lost, and a
        // reconnect with backoff, which is not what this test is about).
        try await events.wait(for: "the worker's session") { $0.contains { if case .connected = $0 { true } else { false } } }
        let jid = events.all.compactMap { if case .connected(_, let jid) = $0 { jid } else { nil } }[0]
        let first = try #require(ccs.simulator.events.compactMap { event -> Int? in
            if case .bound(let session, jid) = event { session } else { nil }
        }.first, "the simulator bound \(jid)")
        let before = events.all.count
        ccs.simulator.sendConnectionDraining(session: first, closeAfter: .milliseconds(200))
        try await ccs.simulator.wait(for: "a replacement session") { $0.openBoundSessions.contains { $0 != first } }
        let delays = events.all[before...].compactMap { if case .reconnectScheduled(_, let delay) = $0 { delay } else { nil } }
        #expect(delays == [.zero], "the worker's events: \(events.all)")
        #expect(ccs.simulator.violations.isEmpty)
    }

    @Test func cancellingTheWorkerClosesEveryStreamCleanly() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        var configuration = try ccs.worker(database: await TestDatabase.make())
        configuration.connections = 2
        let (task, events) = startWorker(configuration)
        let sessions = try await ccs.simulator.waitForBoundSessions(2)
        try await events.wait(for: "both slots connected") { events in
            events.count { if case .connected = $0 { true } else { false } } == 2
        }
        task.cancel()
        try await task.value
        try await ccs.simulator.wait(for: "both sessions closed by the client") { events in
            sessions.allSatisfy { session in
                events.contains { if case .closed(session, let reason) = $0 { reason == XMPPError.closedByPeer.description } else { false } }
            }
        }
    }

    @Test func messagesThatCannotBeAckedOrReadAreReportedAndTheConnectionStaysUp() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let (task, events) = startWorker(try ccs.worker(database: await TestDatabase.make()))
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        ccs.simulator.injectRaw(json: "{\"from\":\"device\",\"category\":\"c\",\"data\":{}}", messageID: nil, from: "device")
        ccs.simulator.injectRaw(json: "{not json", messageID: nil, from: nil)
        ccs.simulator.injectUpstream(messageID: "after-the-bad-ones")
        try await ccs.simulator.wait(for: "the good message's ack") { $0.acked.contains("after-the-bad-ones") }
        try await events.wait(for: "both reports") { events in
            events.contains { if case .unackable = $0 { true } else { false } }
                && events.contains { if case .unreadable = $0 { true } else { false } }
        }
        #expect(ccs.simulator.events.acked == ["after-the-bad-ones"])
        #expect(ccs.simulator.boundSessions.count == 1)
    }

    @Test func aHungConnectionIsDeclaredDeadAndReplaced() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        var configuration = try ccs.worker(database: await TestDatabase.make())
        configuration.pingInterval = .milliseconds(200)
        configuration.pingTimeout = .milliseconds(300)
        configuration.reconnectBase = .milliseconds(100)
        let (task, events) = startWorker(configuration)
        defer { task.cancel() }
        let first = try await ccs.simulator.waitForBoundSessions(1)[0]
        try await events.wait(for: "the worker's side of the session") { events in
            events.contains { if case .connected = $0 { true } else { false } }
        }
        ccs.simulator.mute(session: first)
        try await events.wait(for: "the dead peer") { events in
            events.contains { if case .disconnected(_, .peerUnresponsive) = $0 { true } else { false } }
        }
        try await ccs.simulator.wait(for: "a replacement") { $0.openBoundSessions.contains { $0 != first } }
        ccs.simulator.injectUpstream(messageID: "after-the-hang")
        try await ccs.simulator.wait(for: "its ack") { $0.acked.contains("after-the-hang") }
    }
}
