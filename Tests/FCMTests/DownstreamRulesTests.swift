import Runtime
import FCM
import Testing

@Suite struct NackActionTests {
    @Test func everyDocumentedCodeHasItsAction() {
        let table: [(String, NackAction)] = [
            ("INVALID_JSON", .fail), ("SENDER_ID_MISMATCH", .fail), ("INVALID_APNS_CREDENTIAL", .fail),
            ("AUTHENTICATION_FAILED", .fail), ("BAD_REGISTRATION", .failAndMarkToken(.invalid)),
            ("DEVICE_UNREGISTERED", .failAndMarkToken(.unregistered)), ("SERVICE_UNAVAILABLE", .retryWithBackoff),
            ("INTERNAL_SERVER_ERROR", .retryWithBackoff), ("DEVICE_MESSAGE_RATE_EXCEEDED", .slowDown(.device)),
            ("TOPICS_MESSAGE_RATE_EXCEEDED", .slowDown(.topic)), ("CONNECTION_DRAINING", .resendOnAnotherConnection),
            ("BAD_ACK", .reportOurBug), ("SOMETHING_NEW", .retryWithBackoff),
        ]
        for (code, action) in table { #expect(NackAction(code: code) == action, "\(code)") }
    }
}

@Suite struct DownstreamWindowTests {
    @Test func neverMoreThanTheCapacityAndOnlyItsOwnAnswerFreesASlot() throws {
        var window = DownstreamWindow()
        let now = ContinuousClock.now
        for index in 0..<100 { try window.send(messageID: "m\(index)", stanzaID: "s\(index)", at: now) }
        #expect(!window.hasRoom)
        #expect(throws: DownstreamWindow.SendRefusal.full) { try window.send(messageID: "m100", stanzaID: "s100", at: now) }
        // An answer for a message that is not pending here frees nothing.
        #expect(window.answered(messageID: "elsewhere") == nil)
        #expect(!window.hasRoom)
        #expect(window.answered(messageID: "m7")?.stanzaID == "s7")
        #expect(window.answered(messageID: "m7") == nil)  // a second answer frees nothing more
        #expect(window.count == 99)
        try window.send(messageID: "m100", stanzaID: "s100", at: now)
        #expect(!window.hasRoom)
    }

    @Test func aStanzaErrorMapsBackToItsMessage() throws {
        var window = DownstreamWindow(capacity: 2)
        try window.send(messageID: "m1", stanzaID: "stanza-1", at: .now)
        #expect(window.stanzaError(stanzaID: "stanza-1")?.messageID == "m1")
        #expect(window.stanzaError(stanzaID: "stanza-1") == nil)
        #expect(window.count == 0)
    }

    @Test func duplicatesAreRefusedAndALostConnectionReturnsEverythingPendingOldestFirst() throws {
        var window = DownstreamWindow()
        let start = ContinuousClock.now
        try window.send(messageID: "b", stanzaID: "sb", at: start + .seconds(2))
        try window.send(messageID: "a", stanzaID: "sa", at: start + .seconds(1))
        #expect(throws: DownstreamWindow.SendRefusal.duplicate("a")) { try window.send(messageID: "a", stanzaID: "x", at: start) }
        // The refused send changed nothing: "a" is pending as it was first sent.
        #expect(window.stanzaError(stanzaID: "x") == nil)
        #expect(window.count == 2)
        let lost = window.connectionLost()
        #expect(lost.map(\.messageID) == ["a", "b"])
        #expect(lost.map(\.stanzaID) == ["sa", "sb"])
        #expect(lost.map(\.sentAt) == [start + .seconds(1), start + .seconds(2)])
        #expect(window.count == 0 && window.hasRoom)
    }
}

@Suite struct DownstreamRetryPolicyTests {
    @Test func backoffDoublesFromOneSecondWithJitterUpToTheCap() {
        let policy = DownstreamRetryPolicy()
        var generator = SystemRandomGenerator()
        for (attempt, ceiling) in [(1, 1), (2, 2), (3, 4), (4, 8), (12, 300), (40, 300)] {
            for _ in 0..<50 {
                guard case .retry(let delay) = policy.decide(attempt: attempt, age: .zero, timeToLive: nil, using: &generator) else {
                    Issue.record("gave up at attempt \(attempt)")
                    return
                }
                #expect(delay >= .seconds(ceiling) * 0.5 && delay < .seconds(ceiling) * 1.5, "attempt \(attempt): \(delay)")
            }
        }
    }

    @Test func oldMessagesAndExpiredTimeToLiveAreNotRetried() {
        let policy = DownstreamRetryPolicy()
        var generator = SystemRandomGenerator()
        #expect(policy.decide(attempt: 1, age: .seconds(86_400), timeToLive: nil, using: &generator) == .giveUp)
        #expect(policy.decide(attempt: 1, age: .zero, timeToLive: 0, using: &generator) == .giveUp)
        #expect(policy.decide(attempt: 3, age: .seconds(2), timeToLive: 3, using: &generator) == .giveUp)
        if case .giveUp = policy.decide(attempt: 1, age: .seconds(10), timeToLive: 3600, using: &generator) {
            Issue.record("a fresh message with an hour to live was not retried")
        }
    }
}
