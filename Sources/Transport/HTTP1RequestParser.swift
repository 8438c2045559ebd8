/// A server's reader of HTTP/1.1 requests, on bytes: the head is read in one pass, its size
/// counted as it is scanned, and framed by RFC 9112 to the letter (sections 2.2, 3, 5, 6.1–6.3
/// and 7.1; RFC 9110 5.5), so that no proxy in front can read a request's end elsewhere than
/// this reader does. Anything ambiguous is refused, never guessed at:
///
/// - a start line that is not `method SP target SP HTTP/1.x` (a version other than 1.x: 505);
/// - a field name followed by whitespace before its colon, an obsolete line folding, a bare CR
///   or LF, NUL or another control byte in a value, a value that is not UTF-8;
/// - an HTTP/1.1 request without `Host`, and any of `host`, `content-length`, `content-type`,
///   `authorization`, `x-firebase-appcheck` given twice (`HTTPServerRequest.singletonFields`,
///   as HTTP/2 requests are checked);
/// - a `Content-Length` that is not digits only, `Content-Length` beside `Transfer-Encoding`,
///   `Transfer-Encoding` in an HTTP/1.0 request, `chunked` that is not the last coding (400),
///   a coding other than `chunked` (501);
/// - a chunk size that is not hex digits only, chunk data not followed by CRLF.
///
/// Bounded: a head (or a trailer section) over `maximumHeadBytes` is refused with 431 as soon
/// as that many bytes came without its end, a body over `maximumBodyBytes` with 413. After a
/// refusal the connection must close: the reader does not resynchronize.
package struct HTTP1RequestParser {
    /// A request read whole.
    package struct Request: Sendable {
        package let method: String
        package let target: String
        /// 0 for HTTP/1.0, 1 for HTTP/1.1.
        package let minorVersion: Int
        /// Names lower-cased, values without their surrounding whitespace, in the order sent.
        package let headers: [(name: String, value: String)]
        package let body: [UInt8]
        /// False when the connection closes after the answer (`Connection: close`, or HTTP/1.0
        /// without `Connection: keep-alive`).
        package let keepsAlive: Bool

        package func header(_ name: String) -> String? { headers.first { $0.name == name }?.value }
    }

    /// Why bytes are not a request this server takes, and the status it is answered with.
    package struct Refusal: Error, Equatable, Sendable, CustomStringConvertible {
        /// 400, 413, 431, 501 or 505.
        package let status: Int
        /// The reason code of the answer's body (`malformed_http`, `too_large`, …).
        package let reason: String
        package let message: String
        package var description: String { "\(status) \(reason): \(message)" }

        static func malformed(_ message: String) -> Refusal { Refusal(status: 400, reason: "malformed_http", message: message) }
    }

    private enum Phase {
        /// Looking for the head's end; the first `scanned` bytes held hold none.
        case head(scanned: Int)
        /// The head was read; a body of this many bytes follows.
        case fixedBody(Head, length: Int)
        /// Chunked: a chunk-size line next.
        case chunkSize(Head)
        /// Chunked: this many bytes of a chunk's data to go, then CRLF.
        case chunkData(Head, remaining: Int)
        /// Chunked: after the last chunk, the trailer section (the bytes held scanned so far).
        case trailers(Head, scanned: Int)
    }

    private struct Head {
        var method: String
        var target: String
        var minorVersion: Int
        var headers: [(name: String, value: String)]
        var keepsAlive: Bool
    }

    package let maximumHeadBytes: Int
    package let maximumBodyBytes: Int
    private var buffer: [UInt8] = []
    /// Bytes before it were consumed.
    private var start = 0
    private var phase = Phase.head(scanned: 0)
    private var body: [UInt8] = []
    private enum Continue { case notAsked, asked, told }
    private var continueState = Continue.notAsked

    package init(maximumHeadBytes: Int = 16 << 10, maximumBodyBytes: Int = 8 << 20) {
        self.maximumHeadBytes = maximumHeadBytes
        self.maximumBodyBytes = maximumBodyBytes
    }

    /// The bytes held and not yet consumed by a request handed out.
    package var bufferedByteCount: Int { buffer.count - start }

    /// True while part of a request has arrived (its head begun, or its body under way).
    package var isMidRequest: Bool {
        if case .head = phase { return bufferedByteCount > 0 }
        return true
    }

    package mutating func append(_ bytes: UnsafeRawBufferPointer) {
        if start > 0 && start == buffer.count {
            buffer.removeAll(keepingCapacity: true)
            start = 0
        }
        buffer.append(contentsOf: bytes.bindMemory(to: UInt8.self))
    }

    /// True once when the request being read waits for `HTTP/1.1 100 Continue` before it
    /// sends its body (`Expect: 100-continue`, the body not here yet).
    package mutating func takeContinueRequest() -> Bool {
        guard continueState == .asked else { return false }
        continueState = .told
        return true
    }

    /// The next complete request, or nil when more bytes are needed.
    package mutating func next() throws(Refusal) -> Request? {
        while true {
            switch phase {
            case .head(let scanned):
                guard try readHead(scanned: scanned) else { return nil }
            case .fixedBody(let head, let length):
                guard bufferedByteCount >= length else {
                    noteWaiting(head)
                    return nil
                }
                let request = Request(method: head.method, target: head.target, minorVersion: head.minorVersion, headers: head.headers,
                                      body: Array(buffer[start..<(start + length)]), keepsAlive: head.keepsAlive)
                consume(length)
                finish()
                return request
            case .chunkSize(let head):
                guard try readChunkSize(head) else {
                    noteWaiting(head)
                    return nil
                }
            case .chunkData(let head, let remaining):
                let available = min(remaining, bufferedByteCount)
                body.append(contentsOf: buffer[start..<(start + available)])
                consume(available)
                guard available == remaining, bufferedByteCount >= 2 else {
                    phase = .chunkData(head, remaining: remaining - available)
                    return nil
                }
                guard buffer[start] == 13 && buffer[start + 1] == 10 else { throw .malformed("chunk data not followed by CRLF") }
                consume(2)
                phase = .chunkSize(head)
            case .trailers(let head, let scanned):
                guard try readTrailers(head, scanned: scanned) else { return nil }
                let request = Request(method: head.method, target: head.target, minorVersion: head.minorVersion, headers: head.headers,
                                      body: body, keepsAlive: head.keepsAlive)
                finish()
                return request
            }
        }
    }

    // MARK: - Head

    /// Reads the head once its end is here and sets the phase for the body: false when more
    /// bytes are needed.
    private mutating func readHead(scanned: Int) throws(Refusal) -> Bool {
        var scanned = scanned
        // Empty lines before a request are ignored (RFC 9112 2.2), a few of them.
        var skipped = 0
        while bufferedByteCount >= 2 && buffer[start] == 13 && buffer[start + 1] == 10 && skipped < 4 {
            consume(2)
            skipped += 1
            scanned = 0
        }
        guard let end = findHeadEnd(from: start + scanned) else {
            if bufferedByteCount > maximumHeadBytes { throw Refusal(status: 431, reason: "header_too_large",
                                                                   message: "the request head is over \(maximumHeadBytes) bytes") }
            // Resume where the scan stopped (less the three bytes a CRLFCRLF may straddle).
            phase = .head(scanned: max(0, bufferedByteCount - 3))
            return false
        }
        guard end - start <= maximumHeadBytes else {
            throw Refusal(status: 431, reason: "header_too_large", message: "the request head is over \(maximumHeadBytes) bytes")
        }
        let head = try parseHead(start..<end)
        consume(end + 4 - start)
        try frame(head)
        return true
    }

    private func findHeadEnd(from index: Int) -> Int? {
        var index = index
        let last = buffer.count - 4
        while index <= last {
            // A CRLFCRLF has LF at +1 and +3: step by the LF's place.
            if buffer[index + 3] != 10 {
                index += buffer[index + 3] == 13 ? 1 : 4
                continue
            }
            if buffer[index] == 13 && buffer[index + 1] == 10 && buffer[index + 2] == 13 { return index }
            index += 1
        }
        return nil
    }

    private func parseHead(_ range: Range<Int>) throws(Refusal) -> Head {
        try buffer.withUnsafeBufferPointer { bytes throws(Refusal) -> Head in
            var cursor = range.lowerBound
            let end = range.upperBound
            // The start line: method SP target SP version.
            let methodStart = cursor
            while cursor < end && Self.isTokenByte(bytes[cursor]) { cursor += 1 }
            guard cursor > methodStart, cursor < end, bytes[cursor] == 32 else { throw .malformed("a malformed request line") }
            let method = String(decoding: UnsafeBufferPointer(rebasing: bytes[methodStart..<cursor]), as: UTF8.self)
            cursor += 1
            let targetStart = cursor
            while cursor < end && bytes[cursor] > 32 && bytes[cursor] != 127 { cursor += 1 }
            guard cursor > targetStart, cursor < end, bytes[cursor] == 32 else { throw .malformed("a malformed request target") }
            guard let target = String(validating: UnsafeBufferPointer(rebasing: bytes[targetStart..<cursor]), as: UTF8.self) else {
                throw .malformed("a request target that is not UTF-8")
            }
            cursor += 1
            let lineEnd = Self.lineEnd(bytes, from: cursor, end: end)
            let minorVersion = try Self.version(UnsafeBufferPointer(rebasing: bytes[cursor..<lineEnd]))
            cursor = lineEnd
            // The fields.
            var headers: [(name: String, value: String)] = []
            var hasHost = false
            var closes = false, keepAlive = false
            while cursor < end {
                cursor += 2  // the CRLF ending the line before
                let (name, value, next) = try Self.field(bytes, from: cursor, end: end)
                cursor = next
                if name == "host" { hasHost = true }
                if name == "connection" {
                    for option in value.split(separator: ",") {
                        switch option.trimmingOWS.lowercased() {
                        case "close": closes = true
                        case "keep-alive": keepAlive = true
                        default: break
                        }
                    }
                }
                headers.append((name, value))
            }
            if let repeated = HTTPServerRequest.repeatedSingleton(in: headers) { throw .malformed("more than one \(repeated) field") }
            if minorVersion == 1 && !hasHost { throw .malformed("an HTTP/1.1 request without Host") }
            // `close` wins over `keep-alive`, whichever came first.
            let keepsAlive = !closes && (minorVersion == 1 || keepAlive)
            return Head(method: method, target: target, minorVersion: minorVersion, headers: headers, keepsAlive: keepsAlive)
        }
    }

    /// `HTTP/1.1` or `HTTP/1.0`: its minor version. Another `HTTP/d.d` is 505, anything else 400.
    private static func version(_ bytes: UnsafeBufferPointer<UInt8>) throws(Refusal) -> Int {
        let prefix: [UInt8] = Array("HTTP/".utf8)
        guard bytes.count == 8, bytes.prefix(5).elementsEqual(prefix), bytes[6] == 46,
              (48...57).contains(bytes[5]), (48...57).contains(bytes[7]) else {
            throw .malformed("a malformed HTTP version")
        }
        guard bytes[5] == 49, bytes[7] == 48 || bytes[7] == 49 else {
            throw Refusal(status: 505, reason: "version_not_supported", message: "only HTTP/1.0 and HTTP/1.1 are served (and HTTP/2)")
        }
        return Int(bytes[7] - 48)
    }

    /// Where the line starting at `from` ends (its CR), or `end`.
    private static func lineEnd(_ bytes: UnsafeBufferPointer<UInt8>, from: Int, end: Int) -> Int {
        var index = from
        // The head's range ends at its CRLFCRLF, so the byte after a CR inside it is there.
        while index < end && !(bytes[index] == 13 && bytes[index + 1] == 10) { index += 1 }
        return index
    }

    /// One field line starting at `from`: its lower-cased name, its value without the
    /// surrounding whitespace, and where the line's CRLF is.
    private static func field(_ bytes: UnsafeBufferPointer<UInt8>, from: Int, end: Int) throws(Refusal)
        -> (name: String, value: String, next: Int) {
        var cursor = from
        guard cursor < end, bytes[cursor] != 32 && bytes[cursor] != 9 else {
            throw .malformed("an obsolete line folding (a field line starting with whitespace)")
        }
        var name: [UInt8] = []
        while cursor < end && isTokenByte(bytes[cursor]) {
            let byte = bytes[cursor]
            name.append(byte >= 65 && byte <= 90 ? byte | 0x20 : byte)
            cursor += 1
        }
        guard !name.isEmpty, cursor < end, bytes[cursor] == 58 else {
            throw .malformed("a malformed field line (a name of token characters, then a colon, with nothing between)")
        }
        cursor += 1
        var valueStart = cursor
        while valueStart < end && (bytes[valueStart] == 32 || bytes[valueStart] == 9) { valueStart += 1 }
        var valueEnd = valueStart
        cursor = valueStart
        // A value: SP, HTAB, VCHAR and obs-text; CR only as the CRLF ending the line.
        while cursor < end {
            let byte = bytes[cursor]
            if byte == 13 {
                guard bytes[cursor + 1] == 10 else { throw .malformed("a bare CR in a field value") }
                break
            }
            guard byte == 9 || byte >= 32 && byte != 127 else { throw .malformed("a control character in the \(String(decoding: name, as: UTF8.self)) field") }
            if byte != 32 && byte != 9 { valueEnd = cursor + 1 }
            cursor += 1
        }
        guard let value = String(validating: UnsafeBufferPointer(rebasing: bytes[valueStart..<valueEnd]), as: UTF8.self) else {
            throw .malformed("the \(String(decoding: name, as: UTF8.self)) field is not UTF-8")
        }
        return (String(decoding: name, as: UTF8.self), value, cursor)
    }

    /// RFC 9110 5.6.2's tchar.
    static func isTokenByte(_ byte: UInt8) -> Bool {
        switch byte {
        case 48...57, 65...90, 97...122: true
        case 33, 35, 36, 37, 38, 39, 42, 43, 45, 46, 94, 95, 96, 124, 126: true
        default: false
        }
    }

    // MARK: - Framing

    /// Sets the phase for the body the head announces (RFC 9112 6.3).
    private mutating func frame(_ head: Head) throws(Refusal) {
        var contentLength: String?
        var transferCodings: [Substring] = []
        var hasTransferEncoding = false
        for (name, value) in head.headers {
            if name == "content-length" { contentLength = value }
            if name == "transfer-encoding" {
                hasTransferEncoding = true
                transferCodings += value.split(separator: ",", omittingEmptySubsequences: false).map { $0.trimmingOWS }
            }
        }
        body = []
        if hasTransferEncoding {
            guard head.minorVersion == 1 else { throw .malformed("Transfer-Encoding in an HTTP/1.0 request") }
            guard contentLength == nil else { throw .malformed("both Content-Length and Transfer-Encoding") }
            guard !transferCodings.contains(where: \.isEmpty) else { throw .malformed("an empty transfer coding") }
            let codings = transferCodings.map { $0.lowercased() }
            if codings.last == "chunked" && codings.count == 1 {
                phase = .chunkSize(head)
                return
            }
            if let chunked = codings.firstIndex(of: "chunked"), chunked != codings.count - 1 {
                throw .malformed("chunked is not the last transfer coding")
            }
            throw Refusal(status: 501, reason: "not_implemented", message: "only the chunked transfer coding is served")
        }
        guard let contentLength else {
            phase = .fixedBody(head, length: 0)
            return
        }
        guard !contentLength.isEmpty, contentLength.utf8.count <= 18, contentLength.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }),
              let length = Int(contentLength) else {
            throw .malformed("a Content-Length that is not a number")
        }
        guard length <= maximumBodyBytes else {
            throw Refusal(status: 413, reason: "too_large", message: "the body is over \(maximumBodyBytes) bytes")
        }
        phase = .fixedBody(head, length: length)
    }

    /// Reads a chunk-size line (RFC 9112 7.1): true once read (the phase moves on).
    private mutating func readChunkSize(_ head: Head) throws(Refusal) -> Bool {
        var cursor = start
        var size = 0
        var digits = 0
        while cursor < buffer.count, let digit = Self.hexValue(buffer[cursor]) {
            digits += 1
            guard digits <= 15 else { throw .malformed("a chunk size of more than 15 digits") }
            size = size << 4 | digit
            cursor += 1
        }
        // Extensions (ignored): BWS ";" up to the line's end, within the head's limit.
        var lineEnd: Int?
        var index = cursor
        while index < buffer.count {
            if buffer[index] == 13 {
                guard index + 1 < buffer.count else { break }
                guard buffer[index + 1] == 10 else { throw .malformed("a bare CR in a chunk-size line") }
                lineEnd = index
                break
            }
            index += 1
        }
        guard let lineEnd else {
            if buffer.count - start > maximumHeadBytes { throw .malformed("a chunk-size line over \(maximumHeadBytes) bytes") }
            if digits == 0 && cursor < buffer.count { throw .malformed("a malformed chunk size") }
            return false
        }
        guard digits > 0 else { throw .malformed("a malformed chunk size") }
        try Self.checkChunkExtension(buffer[cursor..<lineEnd])
        consume(lineEnd + 2 - start)
        if size == 0 {
            phase = .trailers(head, scanned: 0)
            return true
        }
        guard body.count + size <= maximumBodyBytes else {
            throw Refusal(status: 413, reason: "too_large", message: "the body is over \(maximumBodyBytes) bytes")
        }
        phase = .chunkData(head, remaining: size)
        return true
    }

    /// What may follow a chunk size on its line: nothing, or whitespace then `;` and the
    /// extensions (no control characters).
    private static func checkChunkExtension(_ bytes: ArraySlice<UInt8>) throws(Refusal) {
        guard !bytes.isEmpty else { return }
        var index = bytes.startIndex
        while index < bytes.endIndex && (bytes[index] == 32 || bytes[index] == 9) { index += 1 }
        guard index < bytes.endIndex, bytes[index] == 59 else { throw .malformed("a malformed chunk size") }
        for byte in bytes[index...] where byte < 32 && byte != 9 || byte == 127 { throw .malformed("a control character in a chunk extension") }
    }

    /// Reads the trailer section up to its empty line (the fields are checked and dropped):
    /// true once read.
    private mutating func readTrailers(_ head: Head, scanned: Int) throws(Refusal) -> Bool {
        if bufferedByteCount >= 2 && buffer[start] == 13 && buffer[start + 1] == 10 {
            consume(2)
            return true
        }
        guard let end = findHeadEnd(from: start + scanned) else {
            if bufferedByteCount > maximumHeadBytes { throw Refusal(status: 431, reason: "header_too_large",
                                                                   message: "the trailer section is over \(maximumHeadBytes) bytes") }
            phase = .trailers(head, scanned: max(0, bufferedByteCount - 3))
            return false
        }
        guard end - start <= maximumHeadBytes else {
            throw Refusal(status: 431, reason: "header_too_large", message: "the trailer section is over \(maximumHeadBytes) bytes")
        }
        try buffer.withUnsafeBufferPointer { bytes throws(Refusal) in
            var cursor = start
            while cursor < end {
                let (_, _, next) = try Self.field(bytes, from: cursor, end: end)
                cursor = next + 2
            }
        }
        consume(end + 4 - start)
        return true
    }

    private static func hexValue(_ byte: UInt8) -> Int? {
        switch byte {
        case 48...57: Int(byte - 48)
        case 65...70: Int(byte - 55)
        case 97...102: Int(byte - 87)
        default: nil
        }
    }

    // MARK: - State

    private mutating func consume(_ count: Int) {
        start += count
        if start == buffer.count {
            buffer.removeAll(keepingCapacity: buffer.capacity <= 64 << 10)
            start = 0
        } else if start >= 64 << 10 && start * 2 >= buffer.count {
            buffer.removeFirst(start)
            start = 0
        }
    }

    private mutating func finish() {
        phase = .head(scanned: 0)
        body = []
        continueState = .notAsked
    }

    private mutating func noteWaiting(_ head: Head) {
        if continueState == .notAsked, head.minorVersion == 1,
           head.headers.contains(where: { $0.name == "expect" && $0.value.lowercased() == "100-continue" }) {
            continueState = .asked
        }
    }
}

extension Substring {
    /// Without the optional whitespace (SP, HTAB) around it.
    fileprivate var trimmingOWS: Substring {
        var result = self
        while let first = result.first, first == " " || first == "\t" { result.removeFirst() }
        while let last = result.last, last == " " || last == "\t" { result.removeLast() }
        return result
    }
}
