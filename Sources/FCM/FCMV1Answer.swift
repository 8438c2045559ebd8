import Foundation
import Runtime

/// FCM's answer to one v1 send: the message's name, or an error as Google's APIs write it
/// (`{"error": {"code", "message", "status", "details": [...]}}`), with what the sender
/// does about it (the v1 reference's `ErrorCode` table, docs/protocol.md's v1 section).
public enum FCMV1Answer: Sendable, Equatable {
    /// 200: `projects/{project}/messages/{id}`.
    case sent(name: String)
    case refused(FCMV1Error)

    /// Reads a response.
    public init(status: Int, headers: [String: String], body: String) {
        let json = try? JSONValue.parse(body)
        if status == 200 {
            if let name = json?["name"]?.stringValue, !name.isEmpty {
                self = .sent(name: name)
            } else {
                self = .refused(FCMV1Error(httpStatus: status, status: "UNKNOWN", errorCode: nil,
                                           message: "a 200 answer without the message's name", retryAfter: nil))
            }
            return
        }
        let error = json?["error"]
        var errorCode: String?
        var violations: [FCMV1Error.FieldViolation] = []
        for detail in error?["details"]?.arrayValue ?? [] {
            let type = detail["@type"]?.stringValue ?? ""
            if type.hasSuffix("google.firebase.fcm.v1.FcmError"), let code = detail["errorCode"]?.stringValue { errorCode = code }
            if type.hasSuffix("google.rpc.BadRequest") {
                for violation in detail["fieldViolations"]?.arrayValue ?? [] {
                    violations.append(.init(field: violation["field"]?.stringValue ?? "", description: violation["description"]?.stringValue ?? ""))
                }
            }
        }
        let canonical = error?["status"]?.stringValue ?? FCMV1Error.canonicalStatus(forHTTP: status)
        self = .refused(FCMV1Error(httpStatus: status, status: canonical, errorCode: errorCode,
                                   message: error?["message"]?.stringValue ?? String(body.prefix(200)),
                                   fieldViolations: violations,
                                   retryAfter: headers["retry-after"].flatMap { LegacyHTTPResponse.parseRetryAfter($0) }))
    }
}
