import FCM
import Foundation
import Testing
@testable import Outbox
@testable import Upstream
@testable import Worker

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

    @Test func aV1RowWithOneTargetKeepsFCMsNameInItsOwnColumnAndAFanOutKeepsEachTokensAnswer() throws {
        var random = SplitMix()
        let policy = DownstreamRetryPolicy()
        func settle(_ outcome: [(target: String, isDevice: Bool, outcome: OutboxSettlement.V1Outcome)], fanOut: Bool,
                    earlier: [String: JSONValue] = [:], attempt: Int = 1) -> OutboxSettlement {
            OutboxSettlement.v1(outcome, fanOut: fanOut, earlier: earlier, rowID: 7, attempt: attempt, age: .seconds(1), timeToLive: nil,
                                policy: policy, maximumRetryAfter: .seconds(300), sentAt: now, now: now, using: &random)
        }
        let name = "projects/p/messages/0:1%ab"
        // One target, taken: acked, the name in message_name, nothing in token_results.
        let taken = settle([("device-1", true, .sent(name: name))], fanOut: false)
        #expect(taken.update == OutboxUpdate(rowID: 7, status: .acked, attempts: 1, sentOn: "v1", sentAt: now, ackedAt: now, messageName: name))
        // One target, refused: failed with FCM's code, the token marked, token_results still empty.
        let gone = OutboxFCMV1Errors.unregistered
        let refused = settle([("device-1", true, .refused(gone))], fanOut: false)
        #expect(refused.update?.status == .failed && refused.update?.errorCode == "UNREGISTERED" && refused.update?.tokenResults == nil)
        #expect(refused.update?.messageName == nil && refused.tokens.first?.state == .unregistered)
        // One target, unavailable and then taken: retried, then acked with the name.
        let retried = settle([("device-1", true, .refused(OutboxFCMV1Errors.unavailable))], fanOut: false)
        #expect(retried.update?.status == .retry && retried.update?.tokenResults == nil)
        let merged = try #require(retried.update).merged(with: try #require(settle([("device-1", true, .sent(name: name))], fanOut: false, attempt: 2).update))
        #expect(merged.status == .acked && merged.messageName == name)
        // A fan-out: each token's answer in token_results, none in message_name.
        let fanOut = settle([("a", true, .sent(name: name)), ("b", true, .refused(OutboxFCMV1Errors.unavailable))], fanOut: true)
        #expect(fanOut.update?.status == .retry && fanOut.update?.messageName == nil)
        let results = try #require(fanOut.update?.tokenResults.flatMap { try? JSONValue.parse($0) })
        #expect(results["a"]?["name"] == .string(name) && results["b"]?["retry"] == .bool(true))
        // Its second attempt sends b alone and merges into what a got: acked.
        let second = settle([("b", true, .sent(name: name + "2"))], fanOut: true, earlier: try #require(results.objectValue), attempt: 2)
        let final = try #require(second.update?.tokenResults.flatMap { try? JSONValue.parse($0) })
        #expect(second.update?.status == .acked && final["a"]?["name"] == .string(name) && final["b"]?["name"] == .string(name + "2"))
        // A fan-out of one token is still a fan-out.
        let single = settle([("a", true, .sent(name: name))], fanOut: true)
        #expect(single.update?.status == .acked && single.update?.messageName == nil && single.update?.tokenResults != nil)
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

/// FCM v1 errors as FCM answers them.
private enum OutboxFCMV1Errors {
    static let unregistered = FCMV1Error(httpStatus: 404, status: "NOT_FOUND", errorCode: "UNREGISTERED",
                                         message: "Requested entity was not found.", retryAfter: nil)
    static let unavailable = FCMV1Error(httpStatus: 503, status: "UNAVAILABLE", errorCode: "UNAVAILABLE",
                                        message: "The service is currently unavailable.", retryAfter: nil)
}
