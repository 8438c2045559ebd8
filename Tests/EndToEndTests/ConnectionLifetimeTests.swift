@testable import FCM
import Foundation
import Simulator
import Testing
import Transport
@testable import XMPP

/// An ended CCS connection is freed, with its stream loop's buffers and wake pipe: neither
/// the ack route its interceptor holds nor the relay its inbox wakes the loop with may keep
/// them (the soak found two descriptors more after every connection).
@Suite struct ConnectionLifetimeTests {
    @Test(arguments: [CCSAckMode.immediate, .durable])
    func anEndedConnectionIsFreed(mode: CCSAckMode) async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let configuration = ccs.client()
        let tls = try TLSContext.client(trust: configuration.trust)
        weak var closed: XMPPConnection<CCSInbound>?
        weak var dropped: XMPPConnection<CCSInbound>?
        weak var closedLoop: StreamLoop?
        weak var droppedLoop: StreamLoop?
        do {
            let first = try await CCSConnection.connect(configuration, ackMode: mode, tls: tls, label: "lifetime-1")
            closed = first.underlying
            closedLoop = first.underlying.streamLoop
            await first.close()
            let before = Set(ccs.simulator.boundSessions)
            let second = try await CCSConnection.connect(configuration, ackMode: mode, tls: tls, label: "lifetime-2")
            dropped = second.underlying
            droppedLoop = second.underlying.streamLoop
            for session in Set(ccs.simulator.boundSessions).subtracting(before) { ccs.simulator.drop(session: session) }
            _ = await second.closed()
        }
        // The threads let go of their loops as they end.
        let deadline = ContinuousClock.now + .seconds(10)
        while (closed != nil || dropped != nil || closedLoop != nil || droppedLoop != nil) && ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(20))
        }
        #expect(closed == nil, "a closed connection is still alive")
        #expect(dropped == nil, "a dropped connection is still alive")
        #expect(closedLoop == nil && droppedLoop == nil, "an ended connection's stream loop is still alive")
    }
}
