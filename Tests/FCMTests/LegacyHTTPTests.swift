import FCM
import Foundation
import Testing

@Suite struct LegacyHTTPMessageTests {
    @Test func aMulticastCarriesEveryOptionAndIsValidated() throws {
        var message = LegacyHTTPMessage(target: .registrationIDs(["a", "b"]), data: ["k": .string("v")])
        message.options.timeToLive = 0
        message.options.priority = .high
        message.restrictedPackageName = "com.example.app"
        try message.validate()
        let body = try JSONValue.parse(message.jsonBody)
        #expect(body["registration_ids"] == .array([.string("a"), .string("b")]))
        #expect(body["time_to_live"] == .number(0))
        #expect(body["restricted_package_name"] == .string("com.example.app"))
        #expect(body["message_id"] == nil && body["to"] == nil)

        let invalid: [(LegacyHTTPMessage, String)] = [
            (LegacyHTTPMessage(target: .registrationIDs([])), "registration_ids"),
            (LegacyHTTPMessage(target: .registrationIDs((0...1000).map { "t\($0)" })), "registration_ids"),
            (LegacyHTTPMessage(target: .registrationIDs(["a", "a"])), "registration_ids"),
            (LegacyHTTPMessage(target: .registrationIDs(["a", "b c"])), "registration_ids[1]"),
            (LegacyHTTPMessage(target: .to("t"), data: ["from": .string("x")]), "data.from"),
            (LegacyHTTPMessage(target: .condition("'a' in topics && 'b' in topics || 'c' in topics && 'd' in topics")), "condition"),
            (LegacyHTTPMessage(target: .notificationKey("")), "notification_key"),
        ]
        for (message, field) in invalid {
            #expect(throws: DownstreamValidationError.self, "\(field)") { try message.validate() }
            do { try message.validate() } catch { #expect(error.field == field) }
        }
        var receipts = LegacyHTTPMessage(target: .to("t"))
        receipts.options.deliveryReceiptRequested = true
        #expect(throws: DownstreamValidationError("delivery_receipt_requested", "is XMPP only: the HTTP protocol sends no receipts")) {
            try receipts.validate()
        }
    }

    @Test func thePlainTextFormCarriesOneTokenAndStringData() throws {
        var message = LegacyHTTPMessage(target: .to("token 1&2"), data: ["text": .string("a b=c")])
        message.options.collapseKey = "score"
        message.options.timeToLive = 60
        message.options.dryRun = true
        #expect(try message.formBody() == "registration_id=token+1%262&collapse_key=score&time_to_live=60&dry_run=1&data.text=a+b%3Dc")
        #expect(throws: DownstreamValidationError.self) { try LegacyHTTPMessage(target: .registrationIDs(["a"])).formBody() }
        #expect(throws: DownstreamValidationError.self) {
            try LegacyHTTPMessage(target: .to("t"), data: ["n": .number(1)]).formBody()
        }
    }
}

@Suite struct LegacyHTTPResponseTests {
    @Test func everyAnswerFormParses() throws {
        let multicast = try LegacyHTTPResponse.parse(status: 200, retryAfter: nil, body: """
            {"multicast_id":216,"success":2,"failure":1,"canonical_ids":1,"results":[
              {"message_id":"1:0408"},{"error":"NotRegistered"},{"message_id":"1:1516","registration_id":"new"}]}
            """, plainText: false, tokens: 3)
        #expect(multicast == .tokens(multicastID: 216, success: 2, failure: 1, canonicalIDs: 1, results: [
            .init(messageID: "1:0408"), .init(error: "NotRegistered"), .init(messageID: "1:1516", canonicalRegistrationID: "new"),
        ]))
        #expect(try LegacyHTTPResponse.parse(status: 200, retryAfter: nil, body: #"{"message_id":1023456}"#, plainText: false, tokens: nil)
                == .topic(messageID: 1023456, error: nil))
        #expect(try LegacyHTTPResponse.parse(status: 200, retryAfter: nil, body: #"{"error":"TopicsMessageRateExceeded"}"#,
                                             plainText: false, tokens: nil) == .topic(messageID: nil, error: "TopicsMessageRateExceeded"))
        #expect(try LegacyHTTPResponse.parse(status: 200, retryAfter: nil, body: "id=1:2342\nregistration_id=32\n", plainText: true, tokens: 1)
                == .plainText(.init(messageID: "1:2342", canonicalRegistrationID: "32")))
        #expect(try LegacyHTTPResponse.parse(status: 200, retryAfter: nil, body: "Error=NotRegistered", plainText: true, tokens: 1)
                == .plainText(.init(error: "NotRegistered")))
    }

    @Test func failuresSayWhatToDo() {
        #expect(throws: LegacyHTTPResponse.Failure.badRequest("Field \"data\" must be a JSON array")) {
            try LegacyHTTPResponse.parse(status: 400, retryAfter: nil, body: "Field \"data\" must be a JSON array\n", plainText: false, tokens: 1)
        }
        #expect(throws: LegacyHTTPResponse.Failure.unauthorized) {
            try LegacyHTTPResponse.parse(status: 401, retryAfter: nil, body: "", plainText: false, tokens: 1)
        }
        #expect(throws: LegacyHTTPResponse.Failure.unavailable(status: 503, retryAfter: .seconds(7))) {
            try LegacyHTTPResponse.parse(status: 503, retryAfter: "7", body: "", plainText: false, tokens: 1)
        }
        #expect(throws: LegacyHTTPResponse.Failure.self) {
            try LegacyHTTPResponse.parse(status: 200, retryAfter: nil, body: #"{"results":[{"message_id":"1"}]}"#, plainText: false, tokens: 2)
        }
        let now = Date(timeIntervalSince1970: 1_000_000_000)
        #expect(LegacyHTTPResponse.parseRetryAfter("Sun, 09 Sep 2001 01:46:50 GMT", now: now) == .seconds(10))
        #expect(LegacyHTTPResponse.parseRetryAfter("soon", now: now) == nil)
    }

    @Test func perTokenErrorsMirrorTheXMPPCodes() {
        #expect(NackAction(httpError: "InvalidRegistration") == .failAndMarkToken(.invalid))
        #expect(NackAction(httpError: "NotRegistered") == .failAndMarkToken(.unregistered))
        #expect(NackAction(httpError: "Unavailable") == .retryWithBackoff)
        #expect(NackAction(httpError: "InternalServerError") == .retryWithBackoff)
        #expect(NackAction(httpError: "DeviceMessageRateExceeded") == .slowDown(.device))
        #expect(NackAction(httpError: "TopicsMessageRateExceeded") == .slowDown(.topic))
        for code in ["MissingRegistration", "InvalidPackageName", "MismatchSenderId", "InvalidParameters", "MessageTooBig",
                     "InvalidDataKey", "InvalidTtl", "InvalidApnsCredential"] {
            #expect(NackAction(httpError: code) == .fail, "\(code)")
        }
    }
}
