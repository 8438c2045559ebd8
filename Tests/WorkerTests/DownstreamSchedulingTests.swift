import Runtime
import FCM
import Foundation
import Testing
@testable import Outbox
@testable import Upstream
@testable import Worker

private func message(_ row: Int64, to target: String = "token", attempt: Int = 1) -> OutgoingDownstream {
    OutgoingDownstream(rowID: row, messageID: "ds-\(row)", target: target, targetIsToken: true, json: "{}", createdAt: Date(),
                       timeToLive: nil, attempt: attempt)
}

@Suite struct DownstreamSchedulerTests {
    @Test func eachLinkTakesAtMostItsWindowAndSendsSpreadOverLinks() {
        var scheduler = DownstreamScheduler()
        scheduler.open(1)
        scheduler.open(2)
        scheduler.enqueue((1...250).map { message($0) })
        let first = scheduler.take(for: 1, now: .now)
        let second = scheduler.take(for: 2, now: .now)
        #expect(first.placed.count == 100 && second.placed.count == 100)
        #expect(first.placed.map(\.message.rowID) == Array(1...100))
        #expect(scheduler.take(for: 1, now: .now).placed.isEmpty)
        #expect(scheduler.readyCount == 50 && scheduler.pendingCount == 200)
        #expect(Set((first.placed + second.placed).map(\.stanzaID)).count == 200)
    }

    @Test func aSlotIsFreedOnlyByTheAnswerToThatMessageOnThatLink() {
        var scheduler = DownstreamScheduler()
        scheduler.open(1)
        scheduler.open(2)
        scheduler.enqueue((1...101).map { message($0) })
        let placed = scheduler.take(for: 1, now: .now).placed
        // An answer on the wrong link, or for something not pending, frees nothing.
        #expect(scheduler.answered(link: 2, messageID: "ds-1") == nil)
        #expect(scheduler.answered(link: 1, messageID: "ds-999") == nil)
        #expect(!scheduler.canTake(for: 1))
        #expect(scheduler.answered(link: 1, messageID: "ds-1")?.message.rowID == 1)
        #expect(scheduler.answered(link: 1, messageID: "ds-1") == nil, "a second answer frees nothing")
        #expect(scheduler.take(for: 1, now: .now).placed.map(\.message.rowID) == [101])
        // A stanza error maps back to its message by the stanza id.
        #expect(scheduler.stanzaError(link: 1, stanzaID: placed[1].stanzaID)?.message.rowID == 2)
        #expect(scheduler.pendingCount(on: 1) == 99)
    }

    @Test func aDrainingLinkTakesNothingAndAClosedLinksMessagesGoFirstAsTheirNextAttempt() {
        var scheduler = DownstreamScheduler()
        scheduler.open(1)
        scheduler.enqueue((1...3).map { message($0) })
        _ = scheduler.take(for: 1, now: .now)
        scheduler.enqueue([message(4)])
        scheduler.drain(1)
        #expect(!scheduler.accepts(1) && !scheduler.canTake(for: 1))
        #expect(scheduler.take(for: 1, now: .now).placed.isEmpty)
        #expect(scheduler.freeSlots == 0)
        // Still answered while draining.
        #expect(scheduler.answered(link: 1, messageID: "ds-2") != nil)
        #expect(scheduler.close(1) == 2)
        scheduler.open(2)
        let resent = scheduler.take(for: 2, now: .now).placed.map(\.message)
        #expect(resent.map(\.rowID) == [1, 3, 4])
        #expect(resent.map(\.attempt) == [2, 2, 1])
    }

    @Test func withdrawnPlacementsFreeTheirSlotsAndGoFirstAsTheSameAttempt() {
        var scheduler = DownstreamScheduler()
        scheduler.open(1)
        scheduler.open(2)
        scheduler.enqueue((1...3).map { message($0) })
        let placed = scheduler.take(for: 1, now: .now).placed
        scheduler.enqueue([message(4)])
        scheduler.drain(1)
        // The draining connection refused the batch: nothing of it was written.
        #expect(scheduler.withdraw(placed, from: 1) == 3)
        #expect(scheduler.pendingCount(on: 1) == 0)
        #expect(scheduler.withdraw(placed, from: 1) == 0, "a second withdrawal changes nothing")
        let resent = scheduler.take(for: 2, now: .now).placed.map(\.message)
        #expect(resent.map(\.rowID) == [1, 2, 3, 4])
        #expect(resent.map(\.attempt) == [1, 1, 1, 1])
        #expect(scheduler.close(1) == 0, "nothing is sent again when the draining link closes")
    }

    @Test func aSlowedDownTargetIsDeferredUntilItsTimeAndOthersGoOn() {
        var scheduler = DownstreamScheduler()
        scheduler.open(1)
        let now = ContinuousClock.now
        scheduler.slowDown(target: "busy", until: now + .seconds(5))
        scheduler.enqueue([message(1, to: "busy"), message(2, to: "calm"), message(3, to: "busy")])
        let batch = scheduler.take(for: 1, now: now)
        #expect(batch.placed.map(\.message.rowID) == [2])
        #expect(batch.deferred.map(\.message.rowID) == [1, 3])
        #expect(batch.deferred.allSatisfy { $0.until == now + .seconds(5) })
        scheduler.enqueue([message(4, to: "busy")])
        #expect(scheduler.take(for: 1, now: now + .seconds(6)).placed.map(\.message.rowID) == [4])
    }

    @Test func handingBackEmptiesTheQueueAndTheWindows() {
        var scheduler = DownstreamScheduler()
        scheduler.open(1)
        scheduler.enqueue((1...150).map { message($0) })
        _ = scheduler.take(for: 1, now: .now)
        let ready = scheduler.removeAllReady(), pending = scheduler.removeAllPending()
        #expect(ready.count == 50)
        #expect(pending.count == 100)
        #expect(Set((ready + pending).map(\.rowID)) == Set(1...150), "every row held comes back")
        #expect(scheduler.readyCount == 0 && scheduler.pendingCount == 0)
    }
}

@Suite struct DownstreamVerdictTests {
    private func nack(_ code: String, attempt: Int = 1, age: Duration = .zero, timeToLive: Int? = nil) -> DownstreamVerdict {
        var generator = SystemRandomGenerator()
        return .nack(code: code, description: "d", attempt: attempt, age: age, timeToLive: timeToLive,
                     policy: DownstreamRetryPolicy(), using: &generator)
    }

    @Test func everyNackCodeHasItsVerdict() {
        for code in ["INVALID_JSON", "SENDER_ID_MISMATCH", "INVALID_APNS_CREDENTIAL", "AUTHENTICATION_FAILED"] {
            #expect(nack(code) == .failed(code: code, description: "d", token: nil))
        }
        #expect(nack("BAD_REGISTRATION") == .failed(code: "BAD_REGISTRATION", description: "d", token: .invalid))
        #expect(nack("DEVICE_UNREGISTERED") == .failed(code: "DEVICE_UNREGISTERED", description: "d", token: .unregistered))
        #expect(nack("CONNECTION_DRAINING") == .resendElsewhere)
        for code in ["SERVICE_UNAVAILABLE", "INTERNAL_SERVER_ERROR", "BAD_ACK", "NEW_CODE"] {
            guard case .retry(let delay, code, "d") = nack(code) else {
                Issue.record("\(code): \(nack(code))")
                continue
            }
            #expect(delay >= .milliseconds(500) && delay < .milliseconds(1500))
        }
        guard case .slowDown(let delay, .device, _, _) = nack("DEVICE_MESSAGE_RATE_EXCEEDED", attempt: 3) else {
            Issue.record("device rate limit")
            return
        }
        #expect(delay >= .seconds(2) && delay < .seconds(6))
        guard case .slowDown(_, .topic, _, _) = nack("TOPICS_MESSAGE_RATE_EXCEEDED") else {
            Issue.record("topic rate limit")
            return
        }
    }

    @Test func aRetryPastTheTimeToLiveOrTheMaximumAgeExpires() {
        #expect(nack("SERVICE_UNAVAILABLE", timeToLive: 0) == .expired(code: "SERVICE_UNAVAILABLE", description: "d"))
        #expect(nack("SERVICE_UNAVAILABLE", age: .seconds(86_400)) == .expired(code: "SERVICE_UNAVAILABLE", description: "d"))
        #expect(nack("DEVICE_MESSAGE_RATE_EXCEEDED", age: .seconds(100), timeToLive: 100)
                == .expired(code: "DEVICE_MESSAGE_RATE_EXCEEDED", description: "d"))
    }

    @Test func stanzaErrorsAreFinalUnlessTheServerCouldNotCope() {
        var generator = SystemRandomGenerator()
        let policy = DownstreamRetryPolicy()
        #expect(DownstreamVerdict.stanzaError(condition: "bad-request", text: "InvalidJson", attempt: 1, age: .zero, timeToLive: nil,
                                              policy: policy, using: &generator)
                == .failed(code: "STANZA_ERROR:bad-request", description: "InvalidJson", token: nil))
        guard case .retry = DownstreamVerdict.stanzaError(condition: "service-unavailable", text: nil, attempt: 1, age: .zero,
                                                         timeToLive: nil, policy: policy, using: &generator) else {
            Issue.record("service-unavailable is retried")
            return
        }
    }
}

@Suite struct OutboxUpdateTests {
    @Test func laterUpdatesWinButARowNeverMovesBackAlongTheSuccessPath() {
        let sentAt = Date(timeIntervalSince1970: 1), ackedAt = Date(timeIntervalSince1970: 2), deliveredAt = Date(timeIntervalSince1970: 3)
        let sent = OutboxUpdate(rowID: 1, status: .sent, attempts: 1, sentOn: "ccs#1.1", sentAt: sentAt, availableAt: Date())
        let acked = OutboxUpdate(rowID: 1, status: .acked, ackedAt: ackedAt, canonicalToken: "new")
        let delivered = OutboxUpdate(rowID: 1, status: .delivered, deliveredAt: deliveredAt)

        let merged = sent.merged(with: acked).merged(with: delivered)
        #expect(merged.status == .delivered && merged.availableAt == nil)
        #expect(merged.sentOn == "ccs#1.1" && merged.sentAt == sentAt && merged.ackedAt == ackedAt && merged.attempts == 1)
        #expect(merged.canonicalToken == "new")
        // A receipt recorded before its ack's update keeps the row delivered.
        #expect(delivered.merged(with: acked).status == .delivered)
        // A decision after a send wins.
        let retry = OutboxUpdate(rowID: 1, status: .retry, errorCode: "SERVICE_UNAVAILABLE", availableAt: Date())
        #expect(sent.merged(with: retry).status == .retry)
        #expect(sent.merged(with: retry).sentOn == "ccs#1.1")
    }
}

@Suite struct DueTimesTests {
    @Test func aDueTimeIsForgottenOnlyOnceItPassedAndItsWriteIsCommitted() {
        var times = DueTimes()
        let start = ContinuousClock.now
        times.insert(start + .seconds(1), written: 5)
        times.insert(start + .seconds(2), written: 6)
        times.insert(start + .milliseconds(1002), written: 7)  // within 5 ms: merged, keeps the later instant and write
        var popped = times.popPassed(before: start, written: 10)
        #expect(!popped.passed && popped.next == start + .milliseconds(1002), "at 1 s the second row is not due yet")
        popped = times.popPassed(before: start + .milliseconds(1001), written: 10)
        #expect(!popped.passed)
        popped = times.popPassed(before: start + .milliseconds(1500), written: 6)
        #expect(!popped.passed && popped.next == start + .milliseconds(1002), "write 7 is not committed yet")
        popped = times.popPassed(before: start + .milliseconds(1500), written: 7)
        #expect(popped.passed && popped.next == start + .seconds(2))
    }
}

@Suite struct OutboxPayloadTests {
    @Test func aPayloadBecomesADownstreamMessageAndUnknownFieldsAreNamed() throws {
        let payload = try JSONValue.parse("""
            {"data":{"k":"v"},"notification":{"title":"T","badge":3,"body_loc_args":["a"]},"time_to_live":0,
             "priority":"high","collapse_key":"c","content_available":true,"mutable_content":false,"dry_run":true,
             "delivery_receipt_requested":true,"message_id":"ignored"}
            """)
        let message = try DownstreamMessage(target: "t", condition: nil, payload: payload, messageID: "ds-1")
        try message.validate()
        #expect(message.messageID == "ds-1" && message.to == "t" && message.timeToLive == 0 && message.priority == .high)
        #expect(message.notification?.badge == "3" && message.notification?.bodyLocArgs == "[\"a\"]")
        #expect(message.json["time_to_live"] == .number(0))
        #expect(message.deliveryReceiptRequested == true && message.dryRun == true && message.collapseKey == "c")

        for (text, field) in [(#"{"frob":1}"#, "payload.frob"), (#"{"to":"x"}"#, "payload.to"), (#"{"data":[1]}"#, "data"),
                              (#"{"time_to_live":1.5}"#, "time_to_live"), (#"{"priority":"urgent"}"#, "priority"),
                              (#"{"notification":{"sparkle":"x"}}"#, "notification.sparkle"), ("[1]", "payload")] {
            #expect(throws: DownstreamValidationError.self, "\(text)") {
                try DownstreamMessage(target: "t", condition: nil, payload: try JSONValue.parse(text), messageID: "m")
            }
            do {
                _ = try DownstreamMessage(target: "t", condition: nil, payload: try JSONValue.parse(text), messageID: "m")
            } catch let error as DownstreamValidationError {
                #expect(error.field == field, "\(text)")
            }
        }
    }
}

@Suite struct WireJSONTests {
    @Test func theSplicedPayloadMeansTheSameAsTheSerialisedMessage() throws {
        let payloads = [#"{"data": {"k": "v"}, "time_to_live": 0, "priority": "high"}"#, "{}", " { } ",
                        #"{"notification": {"title": "T"}, "delivery_receipt_requested": true}"#,
                        #"{"message_id": "theirs", "data": {"k": "v"}}"#]
        for text in payloads {
            let payload = try JSONValue.parse(text)
            for (target, condition) in [("token-1", nil), (nil, "'a' in topics")] as [(String?, String?)] {
                let message = try DownstreamMessage(target: target, condition: condition, payload: payload, messageID: "ds-7")
                let wire = XMPPTransport.wireJSON(of: message, payloadText: text, payloadHasMessageID: payload["message_id"] != nil)
                #expect(try JSONValue.parse(wire) == message.json, "\(text) → \(wire)")
            }
        }
    }

    /// A claimed row keeps whether its payload named a `message_id` (not the parsed payload),
    /// and its wire form carries the worker's id once either way.
    @Test func aClaimedRowKnowsWhetherItsPayloadNamedItsOwnMessageID() throws {
        for (text, named) in [(#"{"message_id": "theirs", "data": {"k": "v"}}"#, true),
                              (#"{"data": {"k": "message_id"}}"#, false)] {
            let row = OutboxStore.ClaimedRow(id: 7, target: "token-1", condition: nil, payload: text, attempts: 0,
                                             createdAt: Date(), tokenState: nil, tokenErrorCode: nil, canonicalToken: nil,
                                             registrationIDs: nil, tokenResults: nil)
            let claimed = try row.claimedMessage(id: "ds-7", validating: true, maximumAge: .seconds(60), now: Date()).get()
            #expect(claimed.payloadHasMessageID == named, "\(text)")
            let wire = XMPPTransport.wireJSON(of: claimed.message, payloadText: text, payloadHasMessageID: claimed.payloadHasMessageID)
            #expect(try JSONValue.parse(wire) == claimed.message.json, "\(text) → \(wire)")
            #expect(wire.components(separatedBy: "message_id").count == (named ? 2 : 3), "\(wire)")
        }
    }
}
