import Foundation

/// An HTTP/1.1 request or response: the start line, headers (names lower-cased) and body.
package struct HTTPMessage: Sendable, Equatable {
    /// `POST /fcm/send HTTP/1.1` or `HTTP/1.1 200 OK`, split on spaces (at most 3 parts).
    package var startLine: [String]
    package var headers: [String: String]
    package var body: [UInt8]

    package init(startLine: [String], headers: [String: String], body: [UInt8]) {
        self.startLine = startLine
        self.headers = headers
        self.body = body
    }

    /// The status of a response (0 if the start line has none).
    package var status: Int { startLine.count > 1 ? Int(startLine[1]) ?? 0 : 0 }
    package var bodyText: String { String(decoding: body, as: UTF8.self) }

    /// True when the peer keeps the connection open after this message.
    package var keepsAlive: Bool { headers["connection"]?.lowercased() != "close" }

    /// The wire form, with `Content-Length` set from the body.
    package func serialized() -> [UInt8] {
        var head = startLine.joined(separator: " ") + "\r\n"
        for (name, value) in headers.sorted(by: { $0.key < $1.key }) where name != "content-length" {
            head += "\(name): \(value)\r\n"
        }
        head += "content-length: \(body.count)\r\n\r\n"
        return Array(head.utf8) + body
    }
}

/// Why bytes are not an acceptable HTTP message.
package struct HTTPMessageError: Error, Equatable, Sendable, CustomStringConvertible {
    package let description: String
    /// The message is over a size limit (a server answers 413), not malformed.
    package let isTooLarge: Bool
    package init(_ description: String, isTooLarge: Bool = false) {
        self.description = description
        self.isTooLarge = isTooLarge
    }
}

/// Assembles HTTP/1.1 messages from bytes as they arrive: head up to the blank line, then
/// a body framed by `Content-Length` or `Transfer-Encoding: chunked`. Bounded: a head over
/// 16 KiB or a body over `maximumBodyBytes` is refused.
package struct HTTPMessageReader {
    private var buffer: [UInt8] = []
    private let maximumBodyBytes: Int
    /// Whether the message being read asked for `100 Continue` (`Expect: 100-continue`)
    /// before sending its body, and whether it was told.
    private enum Continue { case notAsked, asked, told }
    private var continueState = Continue.notAsked

    package init(maximumBodyBytes: Int = 8 << 20) {
        self.maximumBodyBytes = maximumBodyBytes
    }

    /// True while bytes of a message not yet complete are held.
    package var hasBufferedBytes: Bool { !buffer.isEmpty }

    package mutating func append(_ bytes: ArraySlice<UInt8>) {
        buffer.append(contentsOf: bytes)
    }

    /// True once when the message being read is waiting for `HTTP/1.1 100 Continue` before
    /// it sends its body (an HTTP/1.1 head with `Expect: 100-continue`, its body not yet
    /// here): the caller writes it then, and the client sends the body without waiting out
    /// its own timeout.
    package mutating func takeContinueRequest() -> Bool {
        guard continueState == .asked else { return false }
        continueState = .told
        return true
    }

    /// The next complete message, or nil if more bytes are needed.
    package mutating func next() throws(HTTPMessageError) -> HTTPMessage? {
        let message = try assemble()
        if message != nil {
            continueState = .notAsked
        }
        return message
    }

    private mutating func noteWaiting(_ startLine: [String], _ headers: [String: String]) {
        if continueState == .notAsked, startLine.count > 2, startLine[2] == "HTTP/1.1", headers["expect"]?.lowercased() == "100-continue" {
            continueState = .asked
        }
    }

    private mutating func assemble() throws(HTTPMessageError) -> HTTPMessage? {
        guard let headEnd = Self.find([13, 10, 13, 10], in: buffer[...]) else {
            if buffer.count > 16 << 10 { throw HTTPMessageError("the message head is over 16 KiB", isTooLarge: true) }
            return nil
        }
        let head = String(decoding: buffer[..<headEnd], as: UTF8.self)
        var lines = head.components(separatedBy: "\r\n")
        let startLine = lines.removeFirst().split(separator: " ", maxSplits: 2).map(String.init)
        guard startLine.count >= 2 else { throw HTTPMessageError("a malformed start line") }
        var headers: [String: String] = [:]
        for line in lines {
            guard let colon = line.firstIndex(of: ":") else { throw HTTPMessageError("a malformed header line") }
            headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        let bodyStart = headEnd + 4
        if headers["transfer-encoding"]?.lowercased().contains("chunked") == true {
            guard let (body, end) = try chunkedBody(from: bodyStart) else {
                noteWaiting(startLine, headers)
                return nil
            }
            buffer.removeFirst(end)
            return HTTPMessage(startLine: startLine, headers: headers, body: body)
        }
        let length = Int(headers["content-length"] ?? "0") ?? -1
        guard length >= 0 else { throw HTTPMessageError("an unacceptable Content-Length") }
        guard length <= maximumBodyBytes else { throw HTTPMessageError("the body is over \(maximumBodyBytes) bytes", isTooLarge: true) }
        guard buffer.count >= bodyStart + length else {
            noteWaiting(startLine, headers)
            return nil
        }
        let body = Array(buffer[bodyStart..<(bodyStart + length)])
        buffer.removeFirst(bodyStart + length)
        return HTTPMessage(startLine: startLine, headers: headers, body: body)
    }

    private func chunkedBody(from start: Int) throws(HTTPMessageError) -> ([UInt8], Int)? {
        var body: [UInt8] = []
        var cursor = start
        while true {
            guard let lineEnd = Self.find([13, 10], in: buffer[cursor...]) else { return nil }
            let sizeText = String(decoding: buffer[cursor..<lineEnd], as: UTF8.self).split(separator: ";").first ?? ""
            guard let size = Int(sizeText.trimmingCharacters(in: .whitespaces), radix: 16), size >= 0 else {
                throw HTTPMessageError("a malformed chunk size")
            }
            cursor = lineEnd + 2
            if size == 0 {
                // Trailers end with a blank line.
                guard let end = Self.find([13, 10], in: buffer[cursor...]) else { return nil }
                if end == cursor { return (body, end + 2) }
                guard let trailersEnd = Self.find([13, 10, 13, 10], in: buffer[cursor...]) else { return nil }
                return (body, trailersEnd + 4)
            }
            guard body.count + size <= maximumBodyBytes else { throw HTTPMessageError("the body is over \(maximumBodyBytes) bytes", isTooLarge: true) }
            guard buffer.count >= cursor + size + 2 else { return nil }
            body += buffer[cursor..<(cursor + size)]
            cursor += size + 2
        }
    }

    private static func find(_ needle: [UInt8], in haystack: ArraySlice<UInt8>) -> Int? {
        guard haystack.count >= needle.count else { return nil }
        var index = haystack.startIndex
        while index <= haystack.endIndex - needle.count {
            if haystack[index] == needle[0] && haystack[index..<(index + needle.count)].elementsEqual(needle) { return index }
            index += 1
        }
        return nil
    }
}
