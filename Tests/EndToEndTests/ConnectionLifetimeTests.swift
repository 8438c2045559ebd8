@testable import FCM
import Foundation
import Simulator
import Testing
import Transport
import XMPP

/// An ended CCS connection is freed, with its thread's buffers and wake pipe: the ack route
/// its interceptor holds must not keep it (the soak found two descriptors more after every
/// dropped or drained connection).
@Suite struct ConnectionLifetimeTests {
    @Test(arguments: [CCSAckMode.immediate, .durable])
    func anEndedConnectionIsFreed(mode: CCSAckMode) async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let configuration = ccs.client()
        let tls = try TLSContext.client(trust: configuration.trust)
        weak var closed: XMPPConnection<CCSInbound>?
        weak var dropped: XMPPConnection<CCSInbound>?
        do {
            let first = try await CCSConnection.connect(configuration, ackMode: mode, tls: tls, label: "lifetime-1")
            closed = first.underlying
            await first.close()
            let before = Set(ccs.simulator.boundSessions)
            let second = try await CCSConnection.connect(configuration, ackMode: mode, tls: tls, label: "lifetime-2")
            dropped = second.underlying
            for session in Set(ccs.simulator.boundSessions).subtracting(before) { ccs.simulator.drop(session: session) }
            _ = await second.closed()
        }
        // The threads let go of their loops as they end.
        let deadline = ContinuousClock.now + .seconds(10)
        while (closed != nil || dropped != nil) && ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(20))
        }
        #expect(closed == nil, "a closed connection is still alive")
        #expect(dropped == nil, "a dropped connection is still alive")
    }
}
