@testable import FCM
import Foundation
import Simulator
import Synchronization
import Testing
import Transport
import XMPP

/// `CONNECTION_DRAINING` closes a CCS connection to downstream messages on its own thread,
/// as the control message is parsed: a send that comes after it (a batch the sender took
/// just before) is refused without a byte written, so CCS never sees a message sent on a
/// connection it drains; acks of upstream messages still go out on it.
@Suite struct CCSDrainingTests {
    @Test func afterTheControlMessageIsParsedDownstreamSendsAreRefusedAndAcksStillGoOut() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let configuration = ccs.client()
        let tls = try TLSContext.client(trust: configuration.trust)
        let drained = Atomic<Bool>(false)
        let before = Set(ccs.simulator.boundSessions)
        let connection = try await CCSConnection.connect(configuration, ackMode: .durable, tls: tls, label: "draining",
                                                         onDraining: { drained.store(true, ordering: .sequentiallyConsistent) })
        try await ccs.simulator.wait(for: "the session to be bound") { !Set($0.openBoundSessions).subtracting(before).isEmpty }
        let session = Set(ccs.simulator.boundSessions).subtracting(before).min()!
        let early = #"<message id="s1"><gcm xmlns="google:mobile:data">{"to":"t","message_id":"early"}</gcm></message>"#
        #expect(try await connection.send(serialized: early))
        try await ccs.simulator.wait(for: "the early message to be acked") { events in
            events.contains { if case .downstreamAnswered(_, "early", _) = $0 { true } else { false } }
        }

        // An upstream message whose ack waits for its commit (durable mode), as a worker's would.
        let upstream = ccs.simulator.injectUpstream(messageID: "up-1", session: session)
        var durable: DurableAck?
        while durable == nil, let batch = await connection.next(maximum: 10) {
            for case .upstream(let arrival) in batch { if case .afterCommit(let ack) = arrival.ack { durable = ack } }
        }
        guard let ack = durable else {
            Issue.record("no upstream message with a durable ack")
            return
        }

        ccs.simulator.sendConnectionDraining(session: session)
        // The client answered the ping that follows the control message: it parsed both, in order.
        try await ccs.simulator.wait(for: "the drain to be read") { $0.contains(.drainingRead(session: session)) }
        let hookRan = drained.load(ordering: .sequentiallyConsistent)
        #expect(hookRan, "the draining hook did not run")
        let late = #"<message id="s2"><gcm xmlns="google:mobile:data">{"to":"t","message_id":"late"}</gcm></message>"#
        #expect(try await connection.send(serialized: late) == false, "a send after the control message must be refused")

        // The ack still goes out on the draining connection; once CCS has it, it has read
        // everything queued on the connection before it, the refused send included.
        #expect(await DurableAck.send([ack]).allSatisfy { $0.error == nil })
        try await ccs.simulator.wait(for: "the upstream message to be acked") { $0.acked.contains(upstream) }
        let received = ccs.simulator.events.compactMap { event -> String? in
            if case .downstreamReceived(_, let id) = event { id } else { nil }
        }
        #expect(received == ["early"])
        #expect(ccs.simulator.violations.isEmpty)
        await connection.close()
    }
}
