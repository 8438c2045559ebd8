import FCM
import Testing

@Suite struct DownstreamMessageTests {
    private func failure(_ message: DownstreamMessage) -> DownstreamValidationError? {
        do {
            try message.validate()
            return nil
        } catch {
            return error
        }
    }

    @Test func aFullMessageValidatesAndWritesEveryFieldIncludingTTLZero() throws {
        var message = DownstreamMessage(to: "token-1", messageID: "m1", data: ["k": .string("v")])
        message.collapseKey = "score"
        message.priority = .high
        message.contentAvailable = true
        message.mutableContent = false
        message.timeToLive = 0
        message.dryRun = false
        message.deliveryReceiptRequested = true
        var notification = DownstreamMessage.Notification(title: "Hi", body: "There")
        notification.color = "#12aBcD"
        notification.bodyLocArgs = "[\"a\",\"b\"]"
        notification.androidChannelID = "chan"
        notification.clickAction = "https://example.com/open"
        message.notification = notification
        try message.validate()
        let json = message.json
        #expect(json["time_to_live"] == .number(0))
        #expect(json["priority"] == .string("high"))
        #expect(json["delivery_receipt_requested"] == .bool(true))
        #expect(json["content_available"] == .bool(true) && json["mutable_content"] == .bool(false))
        #expect(json["notification"]?["android_channel_id"] == .string("chan"))
        #expect(json["data"] == .object(["k": .string("v")]))
        #expect(json.serialized.contains("\"time_to_live\":0"))
        #expect(json["condition"] == nil)
    }

    @Test func targetsAreExactlyOneAndWellFormed() {
        var both = DownstreamMessage(to: "t", messageID: "m")
        both.condition = "'a' in topics"
        #expect(failure(both)?.field == "condition")
        var none = DownstreamMessage(to: "t", messageID: "m")
        none.to = nil
        #expect(failure(none)?.field == "to")
        #expect(failure(DownstreamMessage(to: "/topics/bad name", messageID: "m"))?.field == "to")
        #expect(failure(DownstreamMessage(to: "/topics/news-1_a.b~c%20", messageID: "m")) == nil)
        #expect(failure(DownstreamMessage(to: "", messageID: "m"))?.field == "to")
        #expect(failure(DownstreamMessage(to: "t", messageID: ""))?.field == "message_id")
    }

    @Test func conditionsAllowAtMostTwoOperators() {
        let valid = ["'a' in topics", "'a' in topics && 'b' in topics", "'a' in topics && ('b' in topics || 'c' in topics)",
                     "\"a\" in topics||'b' in topics"]
        for expression in valid {
            #expect(failure(DownstreamMessage(condition: expression, messageID: "m")) == nil, "\(expression)")
        }
        let invalid = ["'a' in topics && 'b' in topics && 'c' in topics || 'd' in topics", "a in topics", "'a' in topics &&",
                       "('a' in topics", "'a' in topics)", "'a' topics", "'bad name' in topics", ""]
        for expression in invalid {
            #expect(failure(DownstreamMessage(condition: expression, messageID: "m"))?.field == "condition", "\(expression)")
        }
    }

    @Test func timeToLiveRange() {
        for (ttl, ok) in [(0, true), (2_419_200, true), (2_419_201, false), (-1, false)] {
            var message = DownstreamMessage(to: "t", messageID: "m")
            message.timeToLive = ttl
            #expect((failure(message) == nil) == ok, "\(ttl)")
        }
    }

    @Test func reservedDataKeysAreRefusedByName() {
        for key in ["from", "message_type", "google.x", "GCM_key", "collapse_key", "time_to_live", "notification"] {
            let error = failure(DownstreamMessage(to: "t", messageID: "m", data: [key: .string("v")]))
            #expect(error?.field == "data.\(key)", "\(key)")
        }
        #expect(failure(DownstreamMessage(to: "t", messageID: "m", data: ["score": .string("1"), "fromage": .string("x")])) == nil)
    }

    /// Of several wrong fields, the first in key order is named, whatever order the object
    /// holds them in (its dictionary's order changes from one process to the next).
    @Test func ofSeveralWrongFieldsTheFirstInKeyOrderIsNamed() throws {
        func payloadError(_ text: String) throws -> String? {
            do {
                _ = try DownstreamMessage(target: "t", condition: nil, payload: try JSONValue.parse(text), messageID: "m")
                return nil
            } catch let error as DownstreamValidationError {
                return error.field
            }
        }
        #expect(try payloadError(#"{"zeta":1,"to":"x","alpha":2,"priority":"urgent","data":{}}"#) == "payload.alpha")
        #expect(try payloadError(#"{"zz":1,"notification":{"zz":"a","badge":{},"aa":"b"}}"#) == "notification.aa")
        #expect(try payloadError(#"{"time_to_live":"1","priority":"urgent"}"#) == "priority")
        let data: [String: JSONValue] = ["google.y": .string("1"), "gcm.x": .string("2"), "from": .string("3"), "ok": .string("4")]
        #expect(failure(DownstreamMessage(to: "t", messageID: "m", data: data))?.field == "data.from")
    }

    @Test func payloadLimitsAre4096And2048ForTopics() {
        let big: [String: JSONValue] = ["k": .string(String(repeating: "x", count: 4095))]  // 1 + 4095 = 4096
        #expect(failure(DownstreamMessage(to: "t", messageID: "m", data: big)) == nil)
        let tooBig: [String: JSONValue] = ["k": .string(String(repeating: "x", count: 4096))]
        #expect(failure(DownstreamMessage(to: "t", messageID: "m", data: tooBig))?.field == "data")
        let topic: [String: JSONValue] = ["k": .string(String(repeating: "x", count: 2048))]
        #expect(failure(DownstreamMessage(to: "/topics/news", messageID: "m", data: topic))?.field == "data")
        #expect(failure(DownstreamMessage(condition: "'news' in topics", messageID: "m", data: topic))?.field == "data")
        #expect(failure(DownstreamMessage(to: "token", messageID: "m", data: topic)) == nil)
    }

    @Test func notificationFieldsAreChecked() {
        func with(_ change: (inout DownstreamMessage.Notification) -> Void) -> DownstreamValidationError? {
            var notification = DownstreamMessage.Notification(title: "t")
            change(&notification)
            var message = DownstreamMessage(to: "t", messageID: "m")
            message.notification = notification
            return failure(message)
        }
        #expect(with { $0.color = "#fff" }?.field == "notification.color")
        #expect(with { $0.color = "red" }?.field == "notification.color")
        #expect(with { $0.color = "#00ff00" } == nil)
        #expect(with { $0.titleLocArgs = "not json" }?.field == "notification.title_loc_args")
        #expect(with { $0.bodyLocArgs = "[1,2]" }?.field == "notification.body_loc_args")
        #expect(with { $0.icon = "http://insecure.example/icon.png" }?.field == "notification.icon")
        #expect(with { $0.icon = "https://example.com/icon.png" } == nil)
        #expect(DownstreamValidationError("data.from", "is reserved").description == "invalid downstream message: data.from is reserved")
    }
}
