import FCM
import Foundation
import Simulator
import Testing
import Transport
import XMPP
import TestSupport

/// The XMPP client against the simulator over real TLS on loopback.
@Suite struct XMPPSessionTests {
    @Test func handshakeAuthenticatesAndBinds() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let (connection, session) = try await ccs.connect()
        #expect(connection.boundJID.hasPrefix("\(TestCCS.senderID)@gcm.googleapis.com/"))
        #expect(ccs.simulator.events.contains(.bound(session: session, jid: connection.boundJID)))
        await connection.close()
        #expect(ccs.simulator.violations.isEmpty)
    }

    @Test func aWrongServerKeyIsRefusedAsAConfigurationError() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        do {
            _ = try await XMPPConnection<XMLElement>.connect(ccs.client(serverKey: "wrong"))
            Issue.record("connected with a wrong key")
        } catch let error as XMPPError {
            #expect(error == .authenticationRefused(condition: "not-authorized"))
            #expect(error.isConfigurationError)
            #expect(!error.description.contains("wrong"))
        }
        #expect(ccs.simulator.events.contains { if case .authenticationRefused = $0 { true } else { false } })
    }

    @Test func anUntrustedCertificateIsRefused() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let stranger = try CertificateAuthority(commonName: "some other CA")
        do {
            _ = try await XMPPConnection<XMLElement>.connect(ccs.client(trust: .caPEM(stranger.rootCertificatePEM)))
            Issue.record("connected to an untrusted server")
        } catch let error as XMPPError {
            guard case .transport(.certificateRejected(let reason)) = error else {
                Issue.record("wrong error: \(error)")
                return
            }
            #expect(reason.contains("local issuer"), "\(reason)")
            #expect(error.isConfigurationError)
        }
        // The system store does not trust the simulator's CA either.
        await #expect(throws: XMPPError.self) { _ = try await XMPPConnection<XMLElement>.connect(ccs.client(trust: .systemDefault)) }
    }

    @Test func aCertificateForAnotherHostIsRefused() async throws {
        let ccs = try TestCCS(identity: { try $0.issueServerIdentity(commonName: "other.invalid", dnsNames: ["other.invalid"], ipAddresses: []) })
        defer { ccs.simulator.stop() }
        for host in ["localhost", "127.0.0.1"] {
            do {
                _ = try await XMPPConnection<XMLElement>.connect(ccs.client(host: host))
                Issue.record("accepted a certificate for other.invalid at \(host)")
            } catch let error as XMPPError {
                guard case .transport(.certificateRejected(let reason)) = error else {
                    Issue.record("wrong error at \(host): \(error)")
                    continue
                }
                #expect(reason.contains("mismatch"), "\(host): \(reason)")
            }
        }
    }

    /// Reports the nice value of the thread it runs on (the connection's thread).
    private struct PriorityProbe: StanzaInterceptor {
        func intercept(_ stanza: XMLElement) -> Interception<Int32> {
            Interception(inbound: getpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0))
        }
    }

    @Test func theConnectionThreadRunsAtTheConfiguredNiceness() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        var configuration = ccs.client()
        configuration.threadNiceness = 6   // raising a nice value needs no privilege
        let before = Set(ccs.simulator.boundSessions)
        let connection = try await XMPPConnection.connect(configuration, interceptor: PriorityProbe(),
                                                          tls: try TLSContext.client(trust: configuration.trust))
        try await ccs.simulator.wait(for: "the session to be bound") { !Set($0.openBoundSessions).subtracting(before).isEmpty }
        let session = Set(ccs.simulator.boundSessions).subtracting(before).min()!
        ccs.simulator.sendRaw(session: session, Array("<message id=\"probe\"/>".utf8), recordSize: 16 * 1024)
        let received = await connection.next()
        #expect(received == 6)
        await connection.close()
    }

    @Test func aStanzaSentOneByteAtATimeArrivesWhole() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let (connection, session) = try await ccs.connect()
        let stanza = "<message id=\"split\"><data:gcm xmlns:data=\"google:mobile:data\">{\"from\":\"t\",\"message_id\":\"m\",\"data\":{\"é\":\"😀 &amp; &lt;\"}}</data:gcm></message>"
        ccs.simulator.sendRaw(session: session, Array(stanza.utf8), recordSize: 1)
        let received = await connection.next()
        #expect(received?.attribute("id") == "split")
        #expect(received.flatMap(CCSStanza.payload) == "{\"from\":\"t\",\"message_id\":\"m\",\"data\":{\"é\":\"😀 & <\"}}")
        await connection.close()
    }

    @Test func aThousandStanzasInOneWriteArriveInOrder() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let (connection, session) = try await ccs.connect()
        var burst = ""
        for index in 0..<1000 { burst += "<message id=\"b\(index)\"><gcm xmlns=\"google:mobile:data\">{}</gcm></message>" }
        ccs.simulator.sendRaw(session: session, Array(burst.utf8))
        var ids: [String] = []
        while ids.count < 1000, let stanza = await connection.next() { ids.append(stanza.attribute("id") ?? "?") }
        #expect(ids == (0..<1000).map { "b\($0)" })
        await connection.close()
    }

    /// A stanza over the limit is read to its end and skipped (a plain session drops it;
    /// FCM's interceptor sets it aside): the connection goes on. A tag four times the limit,
    /// which expat would have to hold whole, still ends it, with a reason.
    @Test func anOversizedStanzaIsSkippedAndAGiantTagEndsTheConnectionWithAReason() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        var configuration = ccs.client()
        configuration.maxStanzaBytes = 4096
        let (connection, session) = try await ccs.connect(configuration)
        ccs.simulator.sendRaw(session: session, Array(("<message><body>" + String(repeating: "x", count: 10_000) + "</body></message>"
                                                       + "<message id=\"next\"/>").utf8))
        #expect(await connection.next()?.attribute("id") == "next")
        ccs.simulator.sendRaw(session: session, Array(("<message a=\"" + String(repeating: "x", count: 20_000) + "\"/>").utf8))
        #expect(await connection.closed() == .malformedStream(.stanzaTooLarge(limit: 4096)))
        #expect(await connection.next() == nil)
    }

    @Test func malformedXMLEndsTheConnectionWithAReason() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let (connection, session) = try await ccs.connect()
        ccs.simulator.sendRaw(session: session, Array("<message><gcm></message>".utf8))
        guard case .malformedStream(.malformed(let reason)) = await connection.closed() else {
            Issue.record("malformed XML did not end the stream as malformed")
            return
        }
        #expect(reason.contains("mismatched tag"))
    }

    @Test func anEntityBombFromTheServerIsRefusedNotExpanded() async throws {
        let bomb = "<?xml version=\"1.0\"?><!DOCTYPE lolz [<!ENTITY lol \"lol\"><!ENTITY lol2 \"&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;\">]>"
        let ccs = try TestCCS(configure: { $0.preamble = bomb })
        defer { ccs.simulator.stop() }
        do {
            _ = try await XMPPConnection<XMLElement>.connect(ccs.client())
            Issue.record("negotiated through a DOCTYPE")
        } catch let error as XMPPError {
            #expect(error == .malformedStream(.declarationForbidden))
        }
    }

    @Test func aStreamErrorIsSurfacedWithItsCondition() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let (connection, session) = try await ccs.connect()
        ccs.simulator.sendStreamError(session: session, condition: "system-shutdown", text: "maintenance")
        #expect(await connection.closed() == .streamError(condition: "system-shutdown", text: "maintenance"))
    }

    @Test func aDeadPeerIsDetectedByThePingTimeout() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        var configuration = ccs.client()
        configuration.pingInterval = .milliseconds(200)
        configuration.pingTimeout = .milliseconds(300)
        let (connection, session) = try await ccs.connect(configuration)
        // A live server answers the idle ping.
        try await ccs.simulator.wait(for: "a ping") { $0.contains(.pingAnswered(session: session)) }
        #expect(!connection.isClosed)
        ccs.simulator.mute(session: session)
        guard case .peerUnresponsive(let silence) = await connection.closed() else {
            Issue.record("the hung peer was not declared dead")
            return
        }
        #expect(silence >= .milliseconds(300))
    }

    @Test func whitespaceKeepalivesCountAsLife() async throws {
        let ccs = try TestCCS(configure: { $0.whitespaceKeepaliveInterval = .milliseconds(50) })
        defer { ccs.simulator.stop() }
        var configuration = ccs.client()
        configuration.pingInterval = .milliseconds(300)
        let (connection, session) = try await ccs.connect(configuration)
        // Over several ping intervals, keepalives alone keep the client from pinging.
        ccs.simulator.injectUpstream(messageID: "marker", session: session)
        _ = await connection.next()
        let start = ContinuousClock.now
        while ContinuousClock.now - start < .seconds(1) {
            ccs.simulator.injectRaw(json: "{}", messageID: nil, from: nil, session: session)
            _ = await connection.next()
            try await Task.sleep(for: .milliseconds(100))
        }
        #expect(!ccs.simulator.events.contains(.pingAnswered(session: session)))
        #expect(!connection.isClosed)
        await connection.close()
    }

    @Test func cleanShutdownClosesTheStreamAndTLS() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let (connection, session) = try await ccs.connect()
        try await connection.send(serialized: CCSStanza.message(json: "{\"to\":\"t\",\"message_id\":\"last\"}", id: "last"))
        await connection.close()
        #expect(await connection.closed() == .closedLocally)
        try await ccs.simulator.wait(for: "the session to close") { events in
            events.contains { if case .closed(session, let reason) = $0 { reason == XMPPError.closedByPeer.description } else { false } }
        }
        // What was queued before close() went out first.
        #expect(ccs.simulator.events.contains(.downstreamReceived(session: session, messageID: "last")))
        await #expect(throws: XMPPError.self) { try await connection.send(serialized: "<message/>") }
    }

    @Test func aDroppedConnectionEndsAsLost() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let (connection, session) = try await ccs.connect()
        ccs.simulator.drop(session: session)
        guard case .transport(.connectionLost) = await connection.closed() else {
            Issue.record("a drop did not end as connection lost")
            return
        }
    }

    @Test func abortDropsTheConnectionWithoutClosingTheStream() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let (connection, session) = try await ccs.connect()
        connection.abort()
        #expect(await connection.closed() == .closedLocally)
        try await ccs.simulator.wait(for: "the server to see a lost connection") { events in
            events.contains { if case .closed(session, let reason) = $0 { reason.hasPrefix("connection lost") } else { false } }
        }
    }

    @Test func nothingListeningIsAConnectError() async throws {
        var configuration = try TestCCS().client()
        configuration.port = 1
        do {
            _ = try await XMPPConnection<XMLElement>.connect(configuration)
            Issue.record("connected to port 1")
        } catch let error as XMPPError {
            guard case .transport(.connectFailed(_, 1, let reason)) = error else { Issue.record("wrong error \(error)"); return }
            #expect(reason.contains("refused"))
            #expect(!error.isConfigurationError)
        }
    }

    @Test func connectsOverIPv6() async throws {
        let ccs = try TestCCS(configure: { $0.host = "::1" })
        defer { ccs.simulator.stop() }
        let (connection, _) = try await ccs.connect(ccs.client(host: "::1"))
        #expect(connection.boundJID.hasPrefix(TestCCS.senderID))
        await connection.close()
    }

    @Test func aServerThatNeverAnswersTimesOutTheNegotiation() async throws {
        // A TCP listener that accepts (through the kernel backlog) and never speaks TLS.
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
                bind(fd, pointer, length) == 0 && listen(fd, 4) == 0 && getsockname(fd, pointer, &length) == 0
            }
        }
        #expect(bound)
        var configuration = try TestCCS().client()
        configuration.port = Int(UInt16(bigEndian: address.sin_port))
        configuration.negotiationTimeout = .milliseconds(400)
        let started = ContinuousClock.now
        do {
            _ = try await XMPPConnection<XMLElement>.connect(configuration)
            Issue.record("connected to a silent server")
        } catch let error as XMPPError {
            #expect(error == .transport(.tlsFailed("the TLS handshake timed out")))
        }
        #expect(ContinuousClock.now - started < .seconds(5))
    }
}

/// A consumer that stops reading applies backpressure all the way to the server.
@Suite struct InboundBackpressureTests {
    @Test func aFullInboxStopsReadingAndResumesWithoutLoss() async throws {
        let ccs = try TestCCS(configure: { $0.maxUnackedUpstream = 100_000 })
        defer { ccs.simulator.stop() }
        var configuration = ccs.client()
        configuration.inboundCapacity = 8
        let (connection, session) = try await ccs.connect(configuration)
        let total = 3000
        var burst = ""
        for index in 0..<total { burst += "<message id=\"p\(index)\"><gcm xmlns=\"google:mobile:data\">{\"pad\":\"\(String(repeating: "x", count: 200))\"}</gcm></message>" }
        ccs.simulator.sendRaw(session: session, Array(burst.utf8))
        var ids: [String] = []
        while ids.count < total, let stanza = await connection.next() {
            ids.append(stanza.attribute("id") ?? "?")
            if ids.count % 500 == 0 { try await Task.sleep(for: .milliseconds(20)) }  // a slow consumer
        }
        #expect(ids == (0..<total).map { "p\($0)" })
        await connection.close()
    }

    @Test func aPeerThatHangsUpWhileTheConsumerIsSlowEndsTheStreamAfterTheQueuedStanzas() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        var configuration = ccs.client()
        configuration.inboundCapacity = 2
        let (connection, session) = try await ccs.connect(configuration)
        var burst = ""
        for index in 0..<50 { burst += "<message id=\"h\(index)\"/>" }
        ccs.simulator.sendRaw(session: session, Array(burst.utf8))
        ccs.simulator.closeStream(session: session)
        try await ccs.simulator.wait(for: "the server side to close") { $0.contains { if case .closed(session, _) = $0 { true } else { false } } }
        var count = 0
        while await connection.next() != nil { count += 1 }
        #expect(count == 50)
        #expect(await connection.closed() == .closedByPeer)
    }
}

/// Many tasks sending at once: every stanza arrives (a lost wakeup of the connection's
/// thread would strand queued stanzas until this times out). It has a time bound, so it
/// runs in `scripts/test`'s quiet pass: in the busy one, 20,000 sends took over 20 s.
@Suite struct ConcurrentSendTimingTests {
    @Test func twentyThousandStanzasFromFourTasksAllArrive() async throws {
        let ccs = try TestCCS(configure: { $0.maxPendingDownstream = .max; $0.responder = { _ in .noAnswer } })
        defer { ccs.simulator.stop() }
        let (connection, _) = try await ccs.connect()
        // The server never answers, so nothing but the senders' wakeups turns the
        // connection's loop: a lost wakeup stalls the senders (until a ping 60 s later).
        let finished = try await completes(within: .seconds(20)) {
          try await withThrowingTaskGroup(of: Void.self) { group in
            for sender in 0..<4 {
                group.addTask {
                    for index in 0..<5000 {
                        try await connection.send(serialized: CCSStanza.message(json: "{\"to\":\"t\",\"message_id\":\"s\(sender)-\(index)\"}"))
                        if index % 100 == 0 { await Task.yield() }
                    }
                }
            }
            try await group.waitForAll()
          }
        }
        #expect(finished, "the senders stalled")
        try await waitUntil("20,000 downstream messages received", within: .seconds(20),
                            detail: "\(ccs.simulator.counters.downstreamReceived) received") {
            ccs.simulator.counters.downstreamReceived >= 20_000
        }
        #expect(ccs.simulator.counters.downstreamReceived == 20_000)
        await connection.close()
    }
}

/// Runs `body`; false if it has not finished within `limit` (it is then cancelled). A hang
/// detector with a generous limit, not a speed assertion.
func completes(within limit: Duration, _ body: @escaping @Sendable () async throws -> Void) async throws -> Bool {
    try await withThrowingTaskGroup(of: Bool.self) { group in
        group.addTask { try await body(); return true }
        group.addTask { try await Task.sleep(for: limit); return false }
        let first = try await group.next() ?? false
        group.cancelAll()
        return first
    }
}
