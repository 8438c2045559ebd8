import FCM
import Runtime
import Testing
import XMPP

/// A generator that always draws the top of the range, so full-jitter delays equal their ceilings.
private struct Highest: RandomNumberGenerator {
    mutating func next() -> UInt64 { .max }
}

@Suite struct CCSConnectionPlanTests {
    @Test func aLostConnectionIsReplacedAfterAGrowingBackoffThatAHealthySessionResets() {
        var plan = CCSConnectionPlan(backoff: .reconnect(base: .seconds(1), cap: .seconds(8)), healthyAfter: .seconds(60))
        var random = Highest()
        let start = ContinuousClock.now
        #expect(plan.start() == .connect)
        #expect(plan.handle(.connectFailed(.connectionLost("refused")), using: &random) == .reconnect(after: .seconds(1)))
        #expect(plan.handle(.connectFailed(.connectionLost("refused")), using: &random) == .reconnect(after: .seconds(2)))
        #expect(plan.handle(.connected(at: start), using: &random) == .serve)
        // Up for 10 s only: the backoff goes on growing.
        #expect(plan.handle(.ended(.closedByPeer, at: start + .seconds(10)), using: &random) == .reconnect(after: .seconds(4)))
        #expect(plan.handle(.connected(at: start + .seconds(20)), using: &random) == .serve)
        // Up for a minute: healthy, so the next wait starts over.
        #expect(plan.handle(.ended(.peerUnresponsive(silence: .seconds(75)), at: start + .seconds(81)), using: &random) == .reconnect(after: .seconds(1)))
    }

    @Test func drainingGetsAReplacementAtOnceWithoutBackoff() {
        var plan = CCSConnectionPlan(backoff: .reconnect(base: .seconds(1), cap: .seconds(8)))
        var random = Highest()
        _ = plan.handle(.connectFailed(.connectionLost("x")), using: &random)
        #expect(plan.handle(.connected(at: .now), using: &random) == .serve)
        #expect(plan.handle(.draining, using: &random) == .connect)
        #expect(plan.attempt == 1, "draining is not a failure")
    }

    @Test(arguments: [XMPPError.authenticationRefused(condition: "not-authorized"), .transport(.certificateRejected("self-signed")),
                      .streamError(condition: "host-unknown", text: nil)])
    func configurationErrorsStopTheSlot(error: XMPPError) {
        var plan = CCSConnectionPlan()
        #expect(plan.handle(.connectFailed(error)) == .fail(error))
        #expect(plan.handle(.connected(at: .now)) == .stop)
        var ended = CCSConnectionPlan()
        _ = ended.handle(.connected(at: .now))
        #expect(ended.handle(.ended(error, at: .now)) == .fail(error))
    }

    /// A certificate refused on a reconnect, after hours of service, is an incident to retry
    /// and alert on, not a setting: it used to stop the slot and the worker to exit 3, which
    /// systemd's RestartPreventExitStatus=3 turned into a worker that stayed down.
    @Test func aCertificateRefusedAfterASessionIsRetriedWithBackoff() {
        let refusal = XMPPError.transport(.certificateRejected("unknown issuer"))
        var plan = CCSConnectionPlan()
        _ = plan.handle(.connected(at: .now))
        #expect(plan.handle(.ended(.closedByPeer, at: .now)) != .stop)
        guard case .reconnect = plan.handle(.connectFailed(refusal)) else {
            Issue.record("a certificate refused after a session stopped the slot")
            return
        }
        guard case .reconnect = plan.handle(.connectFailed(refusal)) else {
            Issue.record("the second refusal stopped the slot")
            return
        }
        // Refused credentials still stop it (a key revoked while running).
        #expect(plan.handle(.connectFailed(.authenticationRefused(condition: "not-authorized"))) == .fail(.authenticationRefused(condition: "not-authorized")))
    }

    @Test func afterShutdownNothingIsStarted() {
        var plan = CCSConnectionPlan()
        #expect(plan.handle(.shutdown) == .stop)
        #expect(plan.start() == .stop)
        #expect(plan.handle(.ended(.closedByPeer, at: .now)) == .stop)
        #expect(plan.handle(.draining) == .stop)
    }
}
