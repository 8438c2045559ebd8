import FCM
import Foundation
import Ingress
import Transport
import Worker
import XMPP

/// A property of one of the worker's parsers that must hold for any input: the fuzz
/// targets of `scripts/fuzz` (libFuzzer), and the regression tests that replay the corpus
/// and every input a fuzzer found.
public enum FuzzTarget: String, CaseIterable, Sendable {
    /// `JSONValue.parse` and the skim accept and refuse the same texts (same error, same
    /// offset) and agree on the members the skim keeps; a parsed text written back parses
    /// to the same value.
    case json
    /// The XML stream parser gives the same events (or the same error) however the bytes
    /// are split into reads.
    case xml
    /// A CCS message decodes or is refused, never crashes; a decoded upstream message's
    /// `data` text parses to an object.
    case ccs
    /// The HTTP message reader assembles the same messages (or refuses alike) however the
    /// bytes are split.
    case http
    /// The server's HTTP/1.1 request reader (`HTTP1RequestParser`) reads the same requests
    /// and refuses alike (status and reason) however the bytes are split; what it reads
    /// keeps its limits, and a request it reads is framed one way only (never both a
    /// length and chunked, no repeated singleton field).
    case httpRequest = "http-request"
    /// The spool reader splits any bytes into entries and set-aside records, keeps only
    /// valid records, and reads what it wrote back unchanged.
    case spool
    /// An outbox row's payload becomes a downstream message or a field error; a message
    /// that validates has a wire form that parses and names the same message.
    case outbox
    /// A token the HTTPS ingress reads (`JSONWebToken`, `FirebaseTokenVerifier`) is taken
    /// apart or refused, never crashes, and is never accepted: no input verifies against a
    /// key whose private half the input cannot know.
    case jwt
    /// An ingress body (`IngressMessage.parse`, single and batch) is read or refused with a
    /// reason, never crashes; what is read keeps FCM's upstream limits.
    case ingress

    /// Checks the property on `bytes`.
    /// - Throws: `FuzzFinding` when it does not hold (a crash is a finding by itself).
    public func check(_ bytes: [UInt8]) throws(FuzzFinding) {
        switch self {
        case .json: try Self.checkJSON(bytes)
        case .xml:
            try Self.checkSplits(bytes, "XML stream parser") { Self.xmlEvents($0, skipping: false) }
            try Self.checkSplits(bytes, "XML stream parser skipping oversized stanzas") { Self.xmlEvents($0, skipping: true) }
        case .ccs: try Self.checkCCS(bytes)
        case .http: try Self.checkSplits(bytes, "HTTP message reader", Self.httpMessages)
        case .httpRequest: try Self.checkHTTPRequests(bytes)
        case .spool: try Self.checkSpool(bytes)
        case .outbox: try Self.checkOutbox(bytes)
        case .jwt: try Self.checkJWT(bytes)
        case .ingress: try Self.checkIngress(bytes)
        }
    }

    // MARK: - JSON

    private static let keys = JSONParser.Keys(["from", "message_id", "message_type", "category"])

    private static func checkJSON(_ bytes: [UInt8]) throws(FuzzFinding) {
        let text = String(decoding: bytes, as: UTF8.self)
        let parsed: Result<JSONValue, JSONParser.Failure>
        do { parsed = .success(try JSONParser.parse(text)) } catch { parsed = .failure(error) }
        let skimmed: Result<JSONParser.Skim, JSONParser.Failure>
        do { skimmed = .success(try JSONParser.skim(text, keeping: keys, recording: "data")) } catch { skimmed = .failure(error) }
        switch (parsed, skimmed) {
        case (.failure(let a), .failure(let b)):
            guard a.message == b.message, a.offset == b.offset else {
                throw FuzzFinding("parse refused with \(a), the skim with \(b)")
            }
        case (.success, .failure(let b)):
            throw FuzzFinding("parse accepted what the skim refused (\(b))")
        case (.failure(let a), .success):
            throw FuzzFinding("the skim accepted what parse refused (\(a))")
        case (.success(let value), .success(let skim)):
            guard skim.isObject == (value.objectValue != nil) else { throw FuzzFinding("the skim and parse disagree on an object") }
            if case .object(let members) = value {
                for (index, name) in keys.names.enumerated() where skim.strings[index] != members[name]?.stringValue {
                    throw FuzzFinding("the skim kept \(String(describing: skim.strings[index])) for \(name), parse has \(String(describing: members[name]))")
                }
                if let member = members["data"] {
                    guard let text = skim.memberText, (try? JSONParser.parse(text)) == member else {
                        throw FuzzFinding("the skim's text of data does not parse to parse's data")
                    }
                    guard skim.memberIsObject == (member.objectValue != nil) else { throw FuzzFinding("the skim misread data's kind") }
                } else if skim.memberText != nil {
                    throw FuzzFinding("the skim recorded a data member parse does not have")
                }
            }
            let written = value.serialized
            guard let again = try? JSONParser.parse(written) else { throw FuzzFinding("the written text does not parse: \(written.prefix(200))") }
            guard again == value else { throw FuzzFinding("parse → write → parse changed the value") }
            guard again.serialized == written else { throw FuzzFinding("writing is not stable") }
        }
    }

    // MARK: - Splits

    /// Where `bytes` is cut into reads: derived from the bytes themselves, so that a
    /// finding replays exactly.
    public static func splits(of bytes: [UInt8]) -> [Range<Int>] {
        var ranges: [Range<Int>] = []
        var start = 0
        var state = UInt64(bytes.count) &* 0x9E37_79B9_7F4A_7C15
        for byte in bytes.prefix(64) { state = (state ^ UInt64(byte)) &* 0x100_0000_01B3 }
        while start < bytes.count {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            let length = Int(state >> 59) + 1  // 1…32 bytes per read
            let end = min(bytes.count, start + length)
            ranges.append(start..<end)
            start = end
        }
        return ranges
    }

    private static func checkSplits<Output: Equatable>(_ bytes: [UInt8], _ name: String,
                                                       _ run: ([ArraySlice<UInt8>]) -> Output) throws(FuzzFinding) {
        let whole = run([bytes[...]])
        let pieces = run(splits(of: bytes).map { bytes[$0] })
        guard whole == pieces else { throw FuzzFinding("the \(name) gives \(whole) in one read but \(pieces) in pieces") }
    }

    /// The events of the stream, then the error that ended it (if any). Two results are
    /// alike when their events are the same and both end with an error or neither does.
    /// Which error may depend on the split where two are close: expat's wording and place
    /// of a malformed-XML error depend on how much it was given at once
    /// (`Fuzz/regressions/xml-error-position-depends-on-the-split`,
    /// `xml-error-reason-after-the-root-depends-on-the-split`), and the size limit is
    /// checked per read while expat's own checks run per token, so a stanza that passes
    /// the limit inside a long tag that also nests too deep may end as either
    /// (`xml-limit-before-too-deep`). The stream ends the same way whatever the error, and
    /// the error only goes to the log.
    struct Events: Equatable, CustomStringConvertible {
        var events: [XMLStreamEvent] = []
        var error: XMLStreamError?
        var description: String { "\(events.count) event(s)\(error.map { ", then \($0)" } ?? "")" }

        static func == (a: Events, b: Events) -> Bool {
            a.events == b.events && (a.error == nil) == (b.error == nil)
        }
    }

    private static func xmlEvents(_ reads: [ArraySlice<UInt8>], skipping: Bool) -> Events {
        let parser = XMLStreamParser(maxStanzaBytes: 4096, maxDepth: 16, skipsOversizedStanzas: skipping)
        var result = Events()
        for read in reads {
            let (events, failure) = read.withUnsafeBytes { parser.parse($0) }
            result.events += events
            if let failure {
                result.error = failure
                return result
            }
        }
        return result
    }

    struct Messages: Equatable, CustomStringConvertible {
        var messages: [HTTPMessage] = []
        var error: HTTPMessageError?
        var description: String { "\(messages.count) message(s)\(error.map { ", then \($0)" } ?? "")" }
    }

    private static func httpMessages(_ reads: [ArraySlice<UInt8>]) -> Messages {
        var reader = HTTPMessageReader(maximumBodyBytes: 1 << 16)
        var result = Messages()
        for read in reads {
            reader.append(read)
            do {
                while let message = try reader.next() { result.messages.append(message) }
            } catch {
                result.error = error
                return result
            }
        }
        return result
    }

    struct Requests: Equatable, CustomStringConvertible {
        struct Read: Equatable {
            var method: String
            var target: String
            var minorVersion: Int
            var headers: [[String]]
            var body: [UInt8]
            var keepsAlive: Bool
        }
        var requests: [Read] = []
        /// The refusal's status and reason (its message may name what it saw first).
        var refusal: [String]?
        var description: String { "\(requests.count) request(s)\(refusal.map { ", then \($0)" } ?? "")" }
    }

    private static func httpRequests(_ reads: [ArraySlice<UInt8>]) -> Requests {
        var parser = HTTP1RequestParser(maximumHeadBytes: 2048, maximumBodyBytes: 1 << 16)
        var result = Requests()
        for read in reads {
            read.withUnsafeBytes { parser.append($0) }
            do {
                while let request = try parser.next() {
                    result.requests.append(Requests.Read(method: request.method, target: request.target, minorVersion: request.minorVersion,
                                                         headers: request.headers.map { [$0.name, $0.value] }, body: request.body,
                                                         keepsAlive: request.keepsAlive))
                }
            } catch {
                result.refusal = [String(error.status), error.reason]
                return result
            }
        }
        return result
    }

    private static func checkHTTPRequests(_ bytes: [UInt8]) throws(FuzzFinding) {
        try checkSplits(bytes, "HTTP/1.1 request reader", httpRequests)
        let result = httpRequests([bytes[...]])
        if let refusal = result.refusal, !["400", "413", "431", "501", "505"].contains(refusal[0]) {
            throw FuzzFinding("the HTTP/1.1 request reader refused with \(refusal)")
        }
        for request in result.requests {
            guard request.body.count <= 1 << 16 else { throw FuzzFinding("a body over the limit was read") }
            let names = request.headers.map { $0[0] }
            if names.contains("content-length") && names.contains("transfer-encoding") {
                throw FuzzFinding("a request framed both by Content-Length and Transfer-Encoding was read")
            }
            for name in HTTPServerRequest.singletonFields where names.filter({ $0 == name }).count > 1 {
                throw FuzzFinding("a request with two \(name) fields was read")
            }
            if request.minorVersion == 1 && !names.contains("host") { throw FuzzFinding("an HTTP/1.1 request without Host was read") }
            for header in request.headers where header[1].unicodeScalars.contains(where: { $0.value < 0x20 && $0 != "\t" || $0.value == 0x7F }) {
                throw FuzzFinding("a field value with a control character was read: \(header[0])")
            }
        }
    }

    // MARK: - CCS, spool, outbox

    private static func checkCCS(_ bytes: [UInt8]) throws(FuzzFinding) {
        let text = String(decoding: bytes, as: UTF8.self)
        _ = CCSMessage.identity(of: text)
        guard case .upstream(let upstream)? = try? CCSMessage.decode(json: text) else { return }
        guard case .object? = try? JSONParser.parse(upstream.dataJSON) else {
            throw FuzzFinding("an upstream message's data text is not an object: \(upstream.dataJSON.prefix(100))")
        }
        guard upstream.raw == (try? JSONParser.parse(text)) else { throw FuzzFinding("raw differs from the parsed text") }
    }

    private static func checkSpool(_ bytes: [UInt8]) throws(FuzzFinding) {
        let (entries, kept, corrupt, corruptCount) = Spool.parse(Data(bytes))
        // Every record is kept or set aside: no byte but line breaks goes missing.
        guard kept.count(where: { $0 != 0x0A }) + corrupt.count(where: { $0 != 0x0A }) == bytes.count(where: { $0 != 0x0A }),
              corruptCount == 0 || !corrupt.isEmpty else {
            throw FuzzFinding("records went missing: \(bytes.count) bytes, \(kept.count) kept, \(corrupt.count) set aside")
        }
        // What was kept reads back as the same entries, with nothing set aside.
        let again = Spool.parse(kept)
        guard again.entries == entries, again.corruptCount == 0 else { throw FuzzFinding("the kept records do not read back alike") }
        // Entries written as records read back unchanged.
        guard let records = try? Spool.records(entries), Spool.parse(records).entries == entries else {
            throw FuzzFinding("written entries do not read back unchanged")
        }
        // Any text at all (the fuzz input as a payload, its first bytes as a connection
        // label and a time) is written as a record that reads back unchanged.
        let text = String(decoding: bytes, as: UTF8.self)
        var time = 0.0
        if bytes.count >= 8 { time = bytes.prefix(8).withUnsafeBytes { $0.loadUnaligned(as: Double.self) } }
        let made = Spool.Entry(connection: String(text.prefix(12)), payload: text, receivedAt: time.isFinite ? time : 0)
        guard let record = try? Spool.records([made]), Spool.parse(record).entries == [made] else {
            throw FuzzFinding("an entry written as a record does not read back unchanged: \(made)")
        }
    }

    private static func checkOutbox(_ bytes: [UInt8]) throws(FuzzFinding) {
        guard let payload = try? JSONParser.parse(String(decoding: bytes, as: UTF8.self)) else { return }
        let target = payload["to"]?.stringValue ?? "token-1"
        var copy = payload
        if case .object(var members) = copy {
            members["to"] = nil
            members["condition"] = nil
            copy = .object(members)
        }
        guard let message = try? DownstreamMessage(target: target, condition: nil, payload: copy, messageID: "ds-1"),
              (try? message.validate()) != nil else { return }
        let written = message.json.serialized
        guard let wire = try? JSONParser.parse(written), wire == message.json else {
            throw FuzzFinding("a valid message's wire form does not parse back: \(written.prefix(200))")
        }
        guard wire["message_id"] == "ds-1", wire["to"] == .string(target) else {
            throw FuzzFinding("the wire form names another message or target: \(written.prefix(200))")
        }
        // The wire form read back as a payload is the same message.
        if case .object(var members) = wire {
            members["to"] = nil
            guard let back = try? DownstreamMessage(target: target, condition: nil, payload: .object(members), messageID: "ds-1"),
                  back == message else {
                throw FuzzFinding("the wire form does not read back as the same message")
            }
        }
    }

    // MARK: - Ingress

    /// A key set of one freshly made key: no input can carry its signature.
    private static let fuzzKeys: FirebaseKeySet? = {
        guard let key = try? RSAPrivateKey.generate(), let publicKey = try? RSAPublicKey(pem: key.publicKeyPEM) else { return nil }
        return FirebaseKeySet(keys: ["fuzz-key": publicKey])
    }()

    private static func checkJWT(_ bytes: [UInt8]) throws(FuzzFinding) {
        let text = String(decoding: bytes, as: UTF8.self)
        if let token = try? JSONWebToken(text) {
            guard token.signingInput.count <= text.utf8.count else { throw FuzzFinding("the signing input is longer than the token") }
        }
        for kind in [FirebaseTokenRules.Kind.idToken, .appCheck] {
            let rules = FirebaseTokenRules(kind: kind, projectID: "fuzz-project", projectNumber: "1")
            if let accepted = try? FirebaseTokenVerifier.verify(text, rules: rules, keys: fuzzKeys, now: Date()) {
                throw FuzzFinding("a \(kind.rawValue) token the fuzzer could not have signed was accepted (sub \(accepted.subject.prefix(40)))")
            }
        }
    }

    private static func checkIngress(_ bytes: [UInt8]) throws(FuzzFinding) {
        // A single message is read the quick way where it can be: it must read as the full read does.
        let quick = Result { () throws(IngressMessage.Invalid) in try IngressMessage.parse(body: bytes, batch: false)[0] }.flatMap { $0 }
        let full: Result<IngressMessage, IngressMessage.Invalid>
        if let text = String(validating: bytes, as: UTF8.self) {
            full = Result { () throws(IngressMessage.Invalid) in try IngressMessage(try IngressMessage.readWhole(text)) }
        } else {
            full = .failure(IngressMessage.Invalid("the body is not valid UTF-8"))
        }
        switch (quick, full) {
        case (.success(let a), .success(let b)):
            guard a.messageID == b.messageID, a.category == b.category, a.token == b.token, a.timeToLive == b.timeToLive, a.data == b.data else {
                throw FuzzFinding("the quick read of a message differs from the full read")
            }
        case (.failure(let a), .failure(let b)):
            guard a == b else { throw FuzzFinding("the quick read refuses a message otherwise than the full read (\(a) / \(b))") }
        default:
            throw FuzzFinding("the quick read and the full read of a message disagree on whether it is valid")
        }
        for batch in [false, true] {
            guard let results = try? IngressMessage.parse(body: bytes, batch: batch) else { continue }
            guard (1...IngressMessage.maximumBatch).contains(results.count), batch || results.count == 1 else {
                throw FuzzFinding("\(results.count) message(s) read from one \(batch ? "batch" : "body")")
            }
            for case .success(let message) in results {
                let dataBytes = message.data.reduce(0) { $0 + $1.key.utf8.count + $1.value.utf8.count }
                guard !message.messageID.isEmpty, message.messageID.utf8.count <= IngressMessage.maximumIDLength,
                      dataBytes <= IngressMessage.maximumDataBytes else {
                    throw FuzzFinding("a message over the limits was read (id of \(message.messageID.utf8.count) bytes, data of \(dataBytes))")
                }
                guard (try? JSONParser.parse(message.dataJSON))?.objectValue?.count == message.data.count else {
                    throw FuzzFinding("a message's data text does not parse back to its data")
                }
            }
        }
    }
}

/// A property that did not hold.
public struct FuzzFinding: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}
