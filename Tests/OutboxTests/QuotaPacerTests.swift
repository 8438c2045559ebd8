import Testing
@testable import Outbox

/// The v1 transport's quota rules without sockets: the pause after a project quota refusal
/// (a minute, doubling, `Retry-After` when longer) and the paced ramp after it.
@Suite struct QuotaPacerTests {
    let start = ContinuousClock.now

    @Test func aPauseLastsAMinuteOrRetryAfterWhenLongerAndDoublesWhenItFollowsAnother() {
        var pacer = QuotaPacer(now: start)
        let result1 = pacer.admit(at: start)
        #expect(result1, "unpaced before any refusal")
        let result2 = pacer.pause(retryAfter: .seconds(2), at: start, random: 0)
        #expect(result2 == .seconds(60), "a short Retry-After does not shorten the minute")
        let result3 = pacer.admit(at: start + .seconds(59))
        #expect(!result3)
        let result4 = pacer.pause(retryAfter: nil, at: start + .seconds(30), random: 0)
        #expect(result4 == nil, "a refusal during the pause adds none")
        let result5 = pacer.admit(at: start + .seconds(60))
        #expect(result5)
        // The next refusal, within a window: twice as long, with up to a quarter more at random.
        let second = pacer.pause(retryAfter: nil, at: start + .seconds(61), random: 1)
        #expect(second == .seconds(150))
        // Retry-After longer than the backoff wins; the pause never passes five minutes.
        var fresh = QuotaPacer(now: start)
        let result6 = fresh.pause(retryAfter: .seconds(90), at: start, random: 0)
        #expect(result6 == .seconds(90))
        var capped = QuotaPacer(now: start)
        let result7 = capped.pause(retryAfter: .seconds(3600), at: start, random: 0)
        #expect(result7 == .seconds(300))
    }

    @Test func afterAPauseSendingResumesAtTheRateFCMAcceptedAndRampsUp() {
        var pacer = QuotaPacer(initialPause: .seconds(1), window: .seconds(10), now: start)
        // 50 accepted in the window before the refusal: 5 a second.
        for index in 0..<50 { pacer.accepted(at: start + .milliseconds(index * 100)) }
        let refused = start + .seconds(5)
        let result8 = pacer.pause(retryAfter: nil, at: refused, random: 0)
        #expect(result8 == .seconds(1))
        let resumed = refused + .seconds(1)
        // Over the first two seconds after the pause: about 5 a second, not the whole queue at once.
        var admitted = 0
        var now = resumed
        while now < resumed + .seconds(2) {
            if pacer.admit(at: now) { admitted += 1 }
            now += .milliseconds(10)
        }
        #expect((9...12).contains(admitted), "\(admitted) admitted in 2 s at 5/s")
        #expect(pacer.isSlowed)
        #expect(pacer.nextAdmission(at: now) != nil)
        // Each window without another refusal 25 % faster; unpaced at four times the first rate.
        let result9 = pacer.admit(at: resumed + .seconds(10))
        #expect(result9)
        #expect((pacer.rate ?? 0) > 6 && (pacer.rate ?? 0) < 6.5)
        let result10 = pacer.admit(at: resumed + .seconds(70))
        #expect(result10)
        #expect(pacer.rate == nil && !pacer.isSlowed)
    }
}

/// When `SENDER_ID_MISMATCH` answers mean the credentials are wrong, not the tokens.
@Suite struct SenderMismatchWatchTests {
    let start = ContinuousClock.now

    @Test func aFewForeignTokensAmongDeliveriesNeverStopSending() {
        var watch = SenderMismatchWatch()
        var fired = false
        for index in 0..<200 {
            let at = start + .milliseconds(index * 10)
            fired = fired || watch.record(token: "ok-\(index)", mismatch: false, at: at)
            if index % 10 == 0 { fired = fired || watch.record(token: "foreign-\(index)", mismatch: true, at: at) }
        }
        #expect(!fired, "20 foreign tokens among 200 deliveries are the tokens' problem")
    }

    @Test func manyDistinctTokensRefusedAsMostAnswersMeanTheWrongProject() {
        var watch = SenderMismatchWatch()
        for index in 0..<9 {
            let result11 = watch.record(token: "t\(index)", mismatch: true, at: start + .milliseconds(index))
            #expect(!result11)
        }
        // The same token again is not another distinct one.
        let result12 = watch.record(token: "t0", mismatch: true, at: start + .milliseconds(10))
        #expect(!result12)
        let result13 = watch.record(token: "t9", mismatch: true, at: start + .milliseconds(11))
        #expect(result13)
        // Spread over more than the window, they do not add up.
        var slow = SenderMismatchWatch(window: .seconds(60))
        var fired = false
        for index in 0..<20 { fired = fired || slow.record(token: "s\(index)", mismatch: true, at: start + .seconds(index * 10)) }
        #expect(!fired)
    }
}
