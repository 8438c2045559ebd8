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
        if status == 200, let name = Self.onlyName(in: body) {
            self = .sent(name: name)
            return
        }
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
        var quotaScope: FCMV1Error.QuotaScope?
        for detail in error?["details"]?.arrayValue ?? [] {
            let type = detail["@type"]?.stringValue ?? ""
            if type.hasSuffix("google.firebase.fcm.v1.FcmError"), let code = detail["errorCode"]?.stringValue { errorCode = code }
            if type.hasSuffix("google.rpc.BadRequest") {
                for violation in detail["fieldViolations"]?.arrayValue ?? [] {
                    violations.append(.init(field: violation["field"]?.stringValue ?? "", description: violation["description"]?.stringValue ?? ""))
                }
            }
            if type.hasSuffix("google.rpc.QuotaFailure") {
                for violation in detail["violations"]?.arrayValue ?? [] {
                    let text = (violation["subject"]?.stringValue ?? "") + " " + (violation["description"]?.stringValue ?? "")
                    quotaScope = Self.quotaScope(in: text) ?? quotaScope ?? .project
                }
            }
            if type.hasSuffix("google.rpc.ErrorInfo"), quotaScope == nil {
                // RATE_LIMIT_EXCEEDED with the quota's metric: the project's, unless the metric names a device or topic.
                let metric = detail["metadata"]?["quota_metric"]?.stringValue ?? ""
                quotaScope = Self.quotaScope(in: metric) ?? .project
            }
        }
        let canonical = error?["status"]?.stringValue ?? FCMV1Error.canonicalStatus(forHTTP: status)
        let message = error?["message"]?.stringValue ?? String(body.prefix(200))
        if quotaScope == nil, status == 429 || errorCode == "QUOTA_EXCEEDED" { quotaScope = Self.quotaScope(in: message) }
        self = .refused(FCMV1Error(httpStatus: status, status: canonical, errorCode: errorCode, message: message,
                                   fieldViolations: violations,
                                   retryAfter: headers["retry-after"].flatMap { LegacyHTTPResponse.parseRetryAfter($0) },
                                   quotaScope: quotaScope))
    }

    /// The rate a quota refusal's text names (`device`, `topic`, `project`), if any.
    static func quotaScope(in text: String) -> FCMV1Error.QuotaScope? {
        let lower = text.lowercased()
        if lower.contains("device") { return .device }
        if lower.contains("topic") { return .topic }
        if lower.contains("project") { return .project }
        return nil
    }

    /// The name in a success as FCM writes it, `{"name": "projects/…"}` (any whitespace),
    /// read without building a JSON tree; nil for anything else (an escape in the name, other
    /// members), which the full parser then reads.
    static func onlyName(in body: String) -> String? {
        var text = body
        return text.withUTF8 { bytes -> String? in
            var index = 0
            func skipSpace() {
                while index < bytes.count, bytes[index] == 0x20 || bytes[index] == 0x09 || bytes[index] == 0x0A || bytes[index] == 0x0D {
                    index += 1
                }
            }
            func expect(_ literal: StaticString) -> Bool {
                let count = literal.utf8CodeUnitCount
                guard index + count <= bytes.count,
                      memcmp(bytes.baseAddress! + index, literal.utf8Start, count) == 0 else { return false }
                index += count
                return true
            }
            skipSpace()
            guard expect("{") else { return nil }
            skipSpace()
            guard expect("\"name\"") else { return nil }
            skipSpace()
            guard expect(":") else { return nil }
            skipSpace()
            guard expect("\"") else { return nil }
            let start = index
            while index < bytes.count, bytes[index] != 0x22 {
                // An escape or a control character: the full parser decides.
                if bytes[index] == 0x5C || bytes[index] < 0x20 { return nil }
                index += 1
            }
            guard index < bytes.count, index > start else { return nil }
            let name = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self)
            index += 1
            skipSpace()
            guard expect("}") else { return nil }
            skipSpace()
            return index == bytes.count ? name : nil
        }
    }
}
