import FCM
import Foundation
import Testing
@testable import Outbox
@testable import Worker

/// SplitMix64 from a fixed seed: varied draws (a constant one would make a floating-point
/// draw from a half-open range retry forever), the same in every run.
private struct SplitMix: RandomNumberGenerator {
    var state: UInt64 = 0x9E37_79B9_7F4A_7C15
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

@Suite struct OutboxSettlementTests {
    private let now = Date(timeIntervalSince1970: 1_764_500_000)

    @Test func xmppAnswersBecomeRowUpdatesAndTokenMarks() {
        let acked = OutboxSettlement.xmpp(.acked(canonicalToken: "new"), rowID: 1, target: "old", targetIsToken: true, now: now)
        #expect(acked.update?.status == .acked && acked.update?.ackedAt == now && acked.update?.canonicalToken == "new")
        #expect(acked.tokens == [TokenMark(token: "old", state: .replaced, canonicalToken: "new", errorCode: nil)])
        let gone = OutboxSettlement.xmpp(.failed(code: "DEVICE_UNREGISTERED", description: nil, token: .unregistered),
                                         rowID: 2, target: "t", targetIsToken: true, now: now)
        #expect(gone.update?.status == .failed && gone.tokens.first?.state == .unregistered)
        let topic = OutboxSettlement.xmpp(.failed(code: "BAD_REGISTRATION", description: nil, token: .invalid),
                                          rowID: 3, target: "/topics/news", targetIsToken: false, now: now)
        #expect(topic.tokens.isEmpty, "a topic is never marked")
        let slowed = OutboxSettlement.xmpp(.slowDown(after: .seconds(4), scope: .device, code: "DEVICE_MESSAGE_RATE_EXCEEDED", description: nil),
                                           rowID: 4, target: "t", targetIsToken: true, now: now)
        #expect(slowed.update?.status == .retry && slowed.update?.availableAt == now.addingTimeInterval(4))
        #expect(slowed.slowDown == .init(targets: ["t"], duration: .seconds(4)))
        let elsewhere = OutboxSettlement.xmpp(.resendElsewhere, rowID: 5, target: "t", targetIsToken: true, now: now)
        #expect(elsewhere.resendElsewhere && elsewhere.update == nil)
        #expect(OutboxSettlement.handBack(rowID: 6, sentBefore: true, now: now).status == .retry)
        #expect(OutboxSettlement.handBack(rowID: 6, sentBefore: false, now: now).status == .pending)
    }

    @Test func anHTTPAttemptSettlesTheRowFromEveryTokensOutcomeSoFar() throws {
        var random = SplitMix()
        let policy = DownstreamRetryPolicy()
        // First attempt: one token succeeded, one is unavailable, one is gone.
        let first = OutboxSettlement.http([("a", .init(messageID: "1")), ("b", .init(error: "Unavailable")), ("c", .init(error: "NotRegistered"))],
                                          earlier: [:], rowID: 9, attempt: 1, age: .seconds(1), timeToLive: nil, policy: policy,
                                          now: now, using: &random)
        #expect(first.update?.status == .retry && first.update?.attempts == 1)
        #expect(first.tokens == [TokenMark(token: "c", state: .unregistered, canonicalToken: nil, errorCode: "NotRegistered")])
        let results = try #require(first.update?.tokenResults.flatMap { try? JSONValue.parse($0) }?.objectValue)
        #expect(results["b"]?["retry"] == .bool(true) && results["a"]?["message_id"] == .string("1"))
        // Second attempt: only b was sent again, and got through: the row is acked.
        let second = OutboxSettlement.http([("b", .init(messageID: "2"))], earlier: results, rowID: 9, attempt: 2, age: .seconds(3),
                                           timeToLive: nil, policy: policy, now: now, using: &random)
        #expect(second.update?.status == .acked && second.update?.ackedAt == now)
        // No token ever succeeded: failed.
        let none = OutboxSettlement.http([("x", .init(error: "InvalidRegistration"))], earlier: [:], rowID: 10, attempt: 1, age: .zero,
                                         timeToLive: nil, policy: policy, now: now, using: &random)
        #expect(none.update?.status == .failed && none.update?.errorDescription == "every token failed")
        // Retries that would outlive the message's time to live expire it instead.
        let late = OutboxSettlement.http([("y", .init(error: "Unavailable"))], earlier: [:], rowID: 11, attempt: 1, age: .milliseconds(59_600),
                                         timeToLive: 60, policy: policy, now: now, using: &random)
        #expect(late.update?.status == .expired)
    }
}
