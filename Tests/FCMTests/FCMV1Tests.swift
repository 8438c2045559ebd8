import FCM
import Foundation
import Testing
import Transport

/// FCM's HTTP v1 API without sockets: rows translated to v1 messages, answers read and
/// mapped to actions, and the service account's JWT.
@Suite struct FCMV1Tests {
    func request(target: String? = "token-1", condition: String? = nil, _ payload: JSONValue) throws(DownstreamValidationError) -> FCMV1Message {
        let requests = try FCMV1Message.requests(target: target, condition: condition, registrationIDs: nil, payload: payload,
                                                 now: Date(timeIntervalSince1970: 1_000_000))
        #expect(requests.count == 1)
        return requests[0]
    }

    @Test func aLegacyPayloadIsTranslatedFieldByField() throws {
        let translated = try request([
            "data": ["text": "hi", "count": 3, "on": true, "nested": ["a": 1]],
            "notification": ["title": "T", "body": "B", "sound": "ping", "badge": "2", "icon": "i", "android_channel_id": "ch",
                             "body_loc_args": #"["x","y"]"#],
            "priority": "high", "time_to_live": 600, "collapse_key": "news", "restricted_package_name": "com.example",
            "content_available": true, "mutable_content": true, "dry_run": true,
        ])
        let message = translated.body
        // What goes on the wire is that body.
        #expect(try JSONValue.parse(String(decoding: translated.wireBody, as: UTF8.self)) == message)
        #expect(message["validate_only"] == true)
        let body = try #require(message["message"])
        #expect(body["token"] == "token-1")
        // v1's data is strings: other values become their JSON text.
        #expect(body["data"] == ["text": "hi", "count": "3", "on": "true", "nested": #"{"a":1}"#])
        #expect(body["notification"] == ["title": "T", "body": "B"])
        #expect(body["android"] == ["priority": "HIGH", "ttl": "600s", "collapse_key": "news", "restricted_package_name": "com.example",
                                    "notification": ["sound": "ping", "icon": "i", "channel_id": "ch", "body_loc_args": ["x", "y"]]])
        #expect(body["apns"]?["headers"] == ["apns-priority": "10", "apns-expiration": "1000600", "apns-collapse-id": "news"])
        #expect(body["apns"]?["payload"]?["aps"] == ["sound": "ping", "badge": 2, "content-available": 1, "mutable-content": 1])
        #expect(body["webpush"] == ["headers": ["TTL": "600"]])
    }

    @Test func targetsAreMappedAndRegistrationIDsFanOut() throws {
        #expect(try request(target: "/topics/news", [:]).message["topic"] == "news")
        #expect(try request(target: "/topics/news", [:]).target == "/topics/news")
        #expect(try request(target: nil, condition: "'a' in topics", [:]).message["condition"] == "'a' in topics")
        let fanOut = try FCMV1Message.requests(target: nil, condition: nil, registrationIDs: ["a", "b", "c"], payload: ["data": ["k": "v"]],
                                               skipping: ["b"])
        #expect(fanOut.map(\.target) == ["a", "c"])
        #expect(fanOut.allSatisfy { $0.targetIsDevice && $0.message["data"] == ["k": "v"] })
        #expect(throws: DownstreamValidationError.self) {
            _ = try FCMV1Message.requests(target: nil, condition: nil, registrationIDs: [], payload: [:])
        }
    }

    @Test func aV1MessageIsTakenAsIsAndChecked() throws {
        let message = try request(target: "installation-9", ["message": ["fid": "installation-9", "data": ["k": "v"],
                                                                         "android": ["ttl": "3.5s", "priority": "high"]]])
        #expect(message.message["fid"] == "installation-9" && message.message["token"] == nil && message.targetIsDevice)
        // The row's target fills a message that names none.
        #expect(try request(["message": ["data": ["k": "v"]], "validate_only": true]).message["token"] == "token-1")
        func refusal(_ payload: JSONValue) -> String? {
            do {
                _ = try request(payload)
                return nil
            } catch {
                return error.field
            }
        }
        #expect(refusal(["message": ["token": "other"]]) == "message.token")
        #expect(refusal(["message": ["data": ["n": 1]]]) == "message.data.n")
        #expect(refusal(["message": ["data": ["google.x": "v"]]]) == "message.data.google.x")
        #expect(refusal(["message": ["bogus": 1]]) == "message.bogus")
        #expect(refusal(["message": ["android": ["ttl": "60"]]]) == "message.android.ttl")
        #expect(refusal(["message": ["android": ["priority": "urgent"]]]) == "message.android.priority")
        #expect(refusal(["message": ["data": ["big": .string(String(repeating: "x", count: 5000))]]]) == "message.data")
        #expect(refusal(["message": [:], "extra": 1]) == "payload.extra")
        // What v1 cannot carry is refused, named.
        #expect(refusal(["data": ["k": "v"], "delivery_receipt_requested": true]) == "delivery_receipt_requested")
        #expect(refusal(["notification": ["badge": "many"]]) == "notification.badge")
        #expect(refusal(["data": ["from": "x"]]) == "data.from")
    }

    /// A success is read the same whether it takes the short path (FCM's usual
    /// `{"name": …}`) or the full parser (escapes, other members, odd spacing).
    @Test func aSuccessNamesItsMessageHoweverItIsWritten() {
        let name = "projects/p/messages/0:1500415314455276%31bd1c9631bd1c96"
        let bodies = ["{\n  \"name\": \"\(name)\"\n}\n", #"{"name":"\#(name)"}"#, " \t{ \"name\" :\r\n\"\(name)\" } ",
                      #"{"name":"\#(name.replacingOccurrences(of: "/", with: "\\/"))"}"#, #"{"name":"\#(name)","extra":1}"#,
                      #"{"extra":[],"name":"\#(name)"}"#]
        for body in bodies {
            #expect(FCMV1Answer(status: 200, headers: [:], body: body) == .sent(name: name), "\(body)")
        }
        for body in [#"{"name":""}"#, #"{"name":"a"} x"#, "", #"{"name":"unterminated}"#] {
            guard case .refused(let error) = FCMV1Answer(status: 200, headers: [:], body: body) else {
                Issue.record("\(body) was read as a success")
                continue
            }
            #expect(error.status == "UNKNOWN", "\(body)")
        }
    }

    @Test func answersAreReadAsGoogleWritesThemAndMappedToActions() {
        func answer(_ status: Int, _ body: String, retryAfter: String? = nil) -> FCMV1Answer {
            FCMV1Answer(status: status, headers: retryAfter.map { ["retry-after": $0] } ?? [:], body: body)
        }
        func fcm(_ code: Int, _ status: String, _ errorCode: String) -> String {
            #"{"error":{"code":\#(code),"message":"m","status":"\#(status)","details":[{"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"\#(errorCode)"}]}}"#
        }
        #expect(answer(200, #"{"name":"projects/p/messages/1"}"#) == .sent(name: "projects/p/messages/1"))
        func action(_ answer: FCMV1Answer) -> FCMV1Error.Action? {
            if case .refused(let error) = answer { return error.action }
            return nil
        }
        #expect(action(answer(404, fcm(404, "NOT_FOUND", "UNREGISTERED"))) == .failAndMarkToken(.unregistered))
        // Not a dead token: the credentials' project differs from the token's (Google drops tokens only for the two above).
        #expect(action(answer(403, fcm(403, "PERMISSION_DENIED", "SENDER_ID_MISMATCH"))) == .failForSenderMismatch)
        // THIRD_PARTY_AUTH_ERROR by its older name: never an access-token refresh.
        #expect(action(answer(401, fcm(401, "UNAUTHENTICATED", "APNS_AUTH_ERROR"))) == .fail)
        #expect(action(answer(403, fcm(403, "PERMISSION_DENIED", "APNS_AUTH_ERROR"))) == .fail)
        #expect(action(answer(429, fcm(429, "RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED"))) == .slowDownProject)
        #expect(action(answer(503, fcm(503, "UNAVAILABLE", "UNAVAILABLE"))) == .retry)
        #expect(action(answer(500, fcm(500, "INTERNAL", "INTERNAL"))) == .retry)
        #expect(action(answer(401, fcm(401, "UNAUTHENTICATED", "THIRD_PARTY_AUTH_ERROR"))) == .fail)
        #expect(action(answer(401, #"{"error":{"code":401,"message":"m","status":"UNAUTHENTICATED"}}"#)) == .refreshToken)
        #expect(action(answer(403, #"{"error":{"code":403,"message":"m","status":"PERMISSION_DENIED"}}"#)) == .stopSending)
        #expect(action(answer(400, fcm(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT"))) == .fail)
        #expect(action(answer(502, "<html>bad gateway</html>")) == .retry)
        let invalid = answer(400, #"{"error":{"code":400,"message":"bad","status":"INVALID_ARGUMENT","details":[{"@type":"type.googleapis.com/google.rpc.BadRequest","fieldViolations":[{"field":"message.token","description":"not a token"}]}]}}"#)
        #expect(action(invalid) == .failAndMarkToken(.invalid))
        if case .refused(let error) = invalid {
            #expect(error.code == "INVALID_ARGUMENT" && error.description.contains("message.token: not a token"))
        }
        if case .refused(let error) = answer(429, fcm(429, "RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED"), retryAfter: "30") {
            #expect(error.retryAfter == .seconds(30))
        }
        #expect(action(answer(200, "{}")) == .retry, "a 200 without a name is no delivery")
    }

    @Test func quotaRefusalsAreReadInBothOfGooglesShapesAndSayWhoseRateRanOut() {
        func error(_ status: Int, _ body: String) -> FCMV1Error? {
            if case .refused(let error) = FCMV1Answer(status: status, headers: [:], body: body) { return error }
            return nil
        }
        let quotaFailure = { (subject: String, description: String) in
            #"{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"subject":"\#(subject)","description":"\#(description)"}]}"#
        }
        // The API front end's shape: RESOURCE_EXHAUSTED with ErrorInfo, no FcmError.
        let errorInfo = error(429, #"{"error":{"code":429,"message":"Quota exceeded","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"RATE_LIMIT_EXCEEDED","domain":"googleapis.com","metadata":{"quota_metric":"fcm.googleapis.com/fcm_message_requests"}}]}}"#)
        #expect(errorInfo?.isQuota == true && errorInfo?.quotaScope == .project && errorInfo?.action == .slowDownProject)
        // FCM's shape with a QuotaFailure naming a device: that device slows down, not the project.
        let device = error(429, #"{"error":{"code":429,"message":"m","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"QUOTA_EXCEEDED"},\#(quotaFailure("device:abc", "Device message rate exceeded."))]}}"#)
        #expect(device?.quotaScope == .device && device?.action == .slowDownTarget)
        let topic = error(429, #"{"error":{"code":429,"message":"m","status":"RESOURCE_EXHAUSTED","details":[\#(quotaFailure("topic:news", "Topic message rate exceeded."))]}}"#)
        #expect(topic?.quotaScope == .topic && topic?.action == .slowDownTarget)
        let project = error(429, #"{"error":{"code":429,"message":"m","status":"RESOURCE_EXHAUSTED","details":[\#(quotaFailure("project_number:1", "Message rate quota exceeded for the project."))]}}"#)
        #expect(project?.quotaScope == .project && project?.action == .slowDownProject)
        // A bare 429 is the project's.
        #expect(error(429, "Too Many Requests")?.action == .slowDownProject)
    }

    @Test func highPriorityMapsPerPlatformAndApplesTenIsOnlyForAlerts() throws {
        // Data only: Android's HIGH, no APNs priority (10 would be refused for a background push).
        let data = try request(["data": ["k": "v"], "priority": "high"]).message
        #expect(data["android"]?["priority"] == "HIGH")
        #expect(data["apns"]?["headers"]?["apns-priority"] == nil)
        // content_available without an alert: a background push, priority 5.
        let background = try request(["data": ["k": "v"], "priority": "high", "content_available": true]).message
        #expect(background["apns"]?["headers"] == ["apns-priority": "5", "apns-push-type": "background"])
        // An alert: 10 for high, 5 for normal.
        #expect(try request(["notification": ["title": "T"], "priority": "high"]).message["apns"]?["headers"]?["apns-priority"] == "10")
        #expect(try request(["notification": ["sound": "ping"], "priority": "high"]).message["apns"]?["headers"]?["apns-priority"] == "10")
        #expect(try request(["notification": ["title": "T"], "priority": "normal"]).message["apns"]?["headers"]?["apns-priority"] == "5")
    }

    @Test func aTranslatedRowIsCheckedByV1sDataKeyRule() throws {
        // Option names of the legacy API are ordinary data keys in v1.
        let message = try request(["data": ["priority": "p", "to": "t", "collapse_key": "c", "notification": "n"]]).message
        #expect(message["data"] == ["priority": "p", "to": "t", "collapse_key": "c", "notification": "n"])
        for reserved in ["from", "message_type", "google.x", "gcm.y"] {
            #expect(throws: DownstreamValidationError.self) { _ = try request(["data": [reserved: "v"]]) }
        }
    }

    @Test func aTimeToLiveCountsFromWhenTheRowWasQueued() throws {
        let queued = Date(timeIntervalSince1970: 1_000_000)
        let now = queued.addingTimeInterval(250)
        let translated = try FCMV1Message.requests(target: "t", condition: nil, registrationIDs: nil, payload: ["data": ["k": "v"], "time_to_live": 600],
                                                   queuedAt: queued, now: now)[0].message
        #expect(translated["android"]?["ttl"] == "350s")
        #expect(translated["apns"]?["headers"]?["apns-expiration"] == "1000600")
        #expect(translated["webpush"]?["headers"]?["TTL"] == "350")
        let asIs = try FCMV1Message.requests(target: "t", condition: nil, registrationIDs: nil,
                                             payload: ["message": ["android": ["ttl": "600s"], "webpush": ["headers": ["TTL": "600"]]]],
                                             queuedAt: queued, now: now)[0].message
        #expect(asIs["android"]?["ttl"] == "350s" && asIs["webpush"]?["headers"]?["TTL"] == "350")
        // "Now or never" stays 0.
        let now0 = try FCMV1Message.requests(target: "t", condition: nil, registrationIDs: nil, payload: ["data": ["k": "v"], "time_to_live": 0],
                                             queuedAt: queued, now: now)[0].message
        #expect(now0["android"]?["ttl"] == "0s" && now0["apns"]?["headers"]?["apns-expiration"] == "0")
    }

    @Test func theTokenEndpointsTransientAnswersAreNotRefusals() {
        for (status, error) in [(408, nil), (429, nil), (500, nil), (503, nil), (400, "internal_failure"), (400, "server_error"),
                                (400, "temporarily_unavailable")] as [(Int, String?)] {
            #expect(!AccessTokenSource.isRefusal(status: status, error: error), "\(status) \(error ?? "")")
        }
        for (status, error) in [(400, "invalid_grant"), (401, "invalid_client"), (400, "unauthorized_client"), (403, nil)] as [(Int, String?)] {
            #expect(AccessTokenSource.isRefusal(status: status, error: error), "\(status) \(error ?? "")")
        }
    }

    @Test func theAssertionIsAnRS256JWTWithGooglesClaimsAndTheKeyIsNeverShown() throws {
        let key = try RSAPrivateKey.generate()
        let account = try ServiceAccount(json: ServiceAccount(projectID: "p", clientEmail: "sa@p.iam.gserviceaccount.com", privateKeyID: "kid1",
                                                              tokenURI: "https://127.0.0.1:1/token", privateKey: key).keyFileJSON)
        #expect(account.projectID == "p" && account.tokenURI == "https://127.0.0.1:1/token")
        #expect(!"\(account)".contains("PRIVATE"))
        let now = Date(timeIntervalSince1970: 1_700_000_000)
        let parts = try account.assertion(now: now).split(separator: ".").map(String.init)
        #expect(parts.count == 3)
        let header = try JSONValue.parse(String(decoding: Base64URL.decode(parts[0])!, as: UTF8.self))
        let claims = try JSONValue.parse(String(decoding: Base64URL.decode(parts[1])!, as: UTF8.self))
        #expect(header == ["alg": "RS256", "typ": "JWT", "kid": "kid1"])
        #expect(claims == ["iss": "sa@p.iam.gserviceaccount.com", "scope": "https://www.googleapis.com/auth/firebase.messaging",
                           "aud": "https://oauth2.googleapis.com/token", "iat": 1_700_000_000, "exp": 1_700_003_600])
        let publicKey = try RSAPublicKey(pem: key.publicKeyPEM)
        #expect(publicKey.verifySHA256(Array((parts[0] + "." + parts[1]).utf8), signature: Base64URL.decode(parts[2])!))
        #expect(!publicKey.verifySHA256(Array((parts[0] + "." + parts[1] + "x").utf8), signature: Base64URL.decode(parts[2])!))
        for broken in ["[]", #"{"type":"authorized_user"}"#, #"{"project_id":"p","client_email":"e","private_key":"nope"}"#] {
            #expect(throws: ServiceAccount.Invalid.self) { _ = try ServiceAccount(json: broken) }
        }
        do {
            _ = try ServiceAccount(json: #"{"project_id":"p","client_email":"e","private_key":"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----"}"#)
        } catch {
            #expect(!error.description.contains("AAAA"), "the key's text is never part of an error")
        }
    }
}
