import Foundation
import Runtime

/// A request an `HTTPServerConnection` received.
package struct HTTPServerRequest: Sendable {
    package let method: String
    package let path: String
    /// Names lower-cased; HTTP/2's pseudo-headers left out.
    package let headers: [String: String]
    package let body: [UInt8]
    /// `h2` or `http/1.1`.
    package let protocolName: String

    package var bodyText: String { String(decoding: body, as: UTF8.self) }
}

/// A response an `HTTPServerConnection` sends.
package struct HTTPServerResponse: Sendable {
    package var status: Int
    /// Names lower-case (HTTP/2 requires it).
    package var headers: [(name: String, value: String)]
    package var body: [UInt8]

    package init(status: Int, headers: [(name: String, value: String)] = [], body: [UInt8] = []) {
        self.status = status
        self.headers = headers
        self.body = body
    }
}

/// What a server does with a request.
package enum HTTPServerAction: Sendable {
    /// What the connection does after a response.
    package enum Afterwards: Sendable {
        case keepOpen
        /// HTTP/2: a `GOAWAY` at once, naming this request's stream as the last processed
        /// one (a later stream is refused, unprocessed), and the connection closes once the
        /// streams under way are answered. HTTP/1.1: `Connection: close` on the answer.
        case goAway
    }

    /// Answers, after `delay`.
    case respond(HTTPServerResponse, after: Duration = .zero, then: Afterwards = .keepOpen)
    /// HTTP/2: resets the request's stream (`INTERNAL_ERROR`), after it was processed.
    /// HTTP/1.1: closes the connection without an answer.
    case resetStream
    /// Closes the connection at once, without an answer.
    case dropConnection
    /// Never answers.
    case hold
}

/// The server side of one HTTPS connection, HTTP/2 or HTTP/1.1 as ALPN chose: the driver of
/// its stream loop. Each complete request is handed to `handler` (on the loop's thread; it
/// must not block) and its action carried out, answers after a delay included.
package final class HTTPServerConnection: StreamDriver, @unchecked Sendable {
    package typealias Handler = @Sendable (HTTPServerRequest) -> HTTPServerAction

    private let handler: Handler
    private let maximumConcurrentStreams: UInt32
    // Loop thread only.
    private var session: HTTP2Session?
    private var http1: HTTPMessageReader?
    /// HTTP/1.1: a request is being answered (the next waits in the reader).
    private var http1Busy = false
    /// Answers due later: when, on which stream (0 for HTTP/1.1), what.
    private var scheduled = Schedule()
    /// HTTP/2 streams with an answer in `scheduled`.
    private var streamsAwaitingAnswers: Set<Int32> = []
    /// After a GOAWAY: the last stream this side processes.
    private var goAwayLastStreamID: Int32?
    /// Streams opened and not yet answered.
    private var openStreams: Set<Int32> = []

    /// - Parameter maximumConcurrentStreams: announced in `SETTINGS_MAX_CONCURRENT_STREAMS`.
    package init(maximumConcurrentStreams: UInt32 = 100, handler: @escaping Handler) {
        self.handler = handler
        self.maximumConcurrentStreams = maximumConcurrentStreams
    }

    /// Starts serving an accepted socket on a thread of its own.
    package static func serve(fd: Int32, context: TLSContext, name: String, maximumConcurrentStreams: UInt32 = 100,
                              handler: @escaping Handler) {
        let connection = HTTPServerConnection(maximumConcurrentStreams: maximumConcurrentStreams, handler: handler)
        StreamLoop(name: name, origin: .accepted(fd: fd), tlsContext: context, role: .server, handshakeTimeout: .seconds(10),
                   outboundCapacity: 1 << 20, driver: connection).start()
    }

    package func streamDidOpen(_ loop: StreamLoop) {
        if loop.negotiatedProtocol == "h2" {
            do {
                session = try HTTP2Session(role: .server, maximumConcurrentStreams: maximumConcurrentStreams) { [unowned self] event in
                    handle(event, loop: loop)
                }
            } catch {
                loop.abort(reason: error)
                return
            }
            flush(loop)
        } else {
            http1 = HTTPMessageReader()
        }
    }

    package func stream(_ loop: StreamLoop, didRead bytes: UnsafeRawBufferPointer) {
        if let session {
            do {
                try session.receive(bytes)
            } catch {
                loop.abort(reason: error)
                return
            }
            flush(loop)
        } else if http1 != nil {
            http1!.append(ArraySlice(bytes.bindMemory(to: UInt8.self)))
            nextHTTP1Request(loop)
        }
    }

    package func streamDidWake(_ loop: StreamLoop) {
        let now = ContinuousClock.now
        while let answer = scheduled.popFirst(dueBy: now) {
            if session != nil { streamsAwaitingAnswers.remove(answer.streamID) }
            send(answer.response, on: answer.streamID, then: answer.then, loop: loop)
            if loop.isEnded { return }
        }
        flush(loop)
    }

    package var wantsToRead: Bool { true }

    package func nextDeadline(_ loop: StreamLoop) -> ContinuousClock.Instant? {
        scheduled.firstDue
    }

    package func streamDidEnd(_ loop: StreamLoop, reason: any Error) {
        session = nil
        scheduled.removeAll()
        streamsAwaitingAnswers.removeAll()
    }

    // MARK: - HTTP/2

    private func handle(_ event: HTTP2Session.Event, loop: StreamLoop) {
        switch event {
        case .message(let streamID, let message):
            if let last = goAwayLastStreamID, streamID > last {
                // Announced as unprocessed: it is not.
                session?.reset(streamID, errorCode: HTTP2Session.ErrorCode.refusedStream)
                return
            }
            openStreams.insert(streamID)
            var headers: [String: String] = [:]
            for (name, value) in message.headers where !name.hasPrefix(":") { headers[name] = value }
            let request = HTTPServerRequest(method: message.header(":method") ?? "", path: message.header(":path") ?? "",
                                            headers: headers, body: message.body, protocolName: "h2")
            carryOut(handler(request), streamID: streamID, loop: loop)
        case .streamClosed(let streamID, _):
            openStreams.remove(streamID)
            // Closed before its answer was due (the client reset it): the answer is dropped.
            if streamsAwaitingAnswers.remove(streamID) != nil { scheduled.remove(streamID: streamID) }
            closeIfDone(loop)
        case .goAway:
            break
        }
    }

    private func carryOut(_ action: HTTPServerAction, streamID: Int32, loop: StreamLoop) {
        switch action {
        case .respond(let response, let delay, let then):
            if then == .goAway, let session, goAwayLastStreamID == nil {
                // At once: every stream processed so far has a lower id than this one.
                goAwayLastStreamID = streamID
                session.goAway(lastStreamID: streamID)
            }
            if delay <= .zero {
                send(response, on: streamID, then: then, loop: loop)
            } else {
                if session != nil { streamsAwaitingAnswers.insert(streamID) }
                scheduled.add((.now + delay, streamID, response, then))
            }
        case .resetStream:
            if let session {
                session.reset(streamID, errorCode: HTTP2Session.ErrorCode.internalError)
            } else {
                loop.abort(reason: TransportError.connectionLost("reset by the script"))
            }
        case .dropConnection:
            loop.abort(reason: TransportError.connectionLost("dropped by the script"))
        case .hold:
            break
        }
    }

    private func send(_ response: HTTPServerResponse, on streamID: Int32, then: HTTPServerAction.Afterwards, loop: StreamLoop) {
        if let session {
            var headers: [(name: String, value: String)] = [(":status", String(response.status))]
            headers += response.headers
            headers.append(("content-length", String(response.body.count)))
            session.submitResponse(HTTP2Session.Message(headers: headers, body: response.body), on: streamID)
            flush(loop)
        } else {
            var headers: [String: String] = [:]
            for (name, value) in response.headers { headers[name] = value }
            if then == .goAway { headers["connection"] = "close" }
            let message = HTTPMessage(startLine: ["HTTP/1.1", String(response.status), response.status < 400 ? "OK" : "Error"],
                                      headers: headers, body: response.body)
            loop.write(bytes: message.serialized(), recordSize: StreamLoop.recordSize)
            http1Busy = false
            if then == .goAway {
                loop.close(reason: TransportError.closedByPeer)
            } else {
                nextHTTP1Request(loop)
            }
        }
    }

    private func flush(_ loop: StreamLoop) {
        guard let session else { return }
        let bytes = session.output()
        if !bytes.isEmpty { loop.write(bytes: bytes, recordSize: StreamLoop.recordSize) }
        closeIfDone(loop)
    }

    /// After a GOAWAY, the connection closes once every processed stream was answered.
    private func closeIfDone(_ loop: StreamLoop) {
        guard let session, goAwayLastStreamID != nil, openStreams.isEmpty, scheduled.isEmpty, !loop.isClosing else { return }
        let bytes = session.output()
        if !bytes.isEmpty { loop.write(bytes: bytes, recordSize: StreamLoop.recordSize) }
        loop.close(reason: TransportError.closedByPeer)
    }

    // MARK: - HTTP/1.1

    private func nextHTTP1Request(_ loop: StreamLoop) {
        guard !http1Busy, !loop.isEnded, !loop.isClosing else { return }
        let message: HTTPMessage
        do {
            guard let next = try http1?.next() else { return }
            message = next
        } catch {
            let refusal = HTTPMessage(startLine: ["HTTP/1.1", "400", "Bad Request"], headers: ["connection": "close"],
                                      body: Array("malformed HTTP request: \(error)".utf8))
            loop.write(bytes: refusal.serialized(), recordSize: StreamLoop.recordSize)
            loop.close(reason: TransportError.connectionLost("a malformed request"))
            return
        }
        http1Busy = true
        let request = HTTPServerRequest(method: message.startLine.first ?? "", path: message.startLine.count > 1 ? message.startLine[1] : "",
                                        headers: message.headers, body: message.body, protocolName: "http/1.1")
        carryOut(handler(request), streamID: 0, loop: loop)
    }
}

/// Answers due later, earliest first. A fixed latency makes them due in the order they are
/// added, so each is appended (one of a shorter delay goes in its place) and taken from the
/// front, without scanning the others.
private struct Schedule {
    typealias Answer = (due: ContinuousClock.Instant, streamID: Int32, response: HTTPServerResponse, then: HTTPServerAction.Afterwards)

    private var answers: [Answer] = []
    /// Answers before it were taken.
    private var head = 0

    var isEmpty: Bool { head == answers.count }

    var firstDue: ContinuousClock.Instant? { isEmpty ? nil : answers[head].due }

    mutating func add(_ answer: Answer) {
        var index = answers.count
        while index > head && answers[index - 1].due > answer.due { index -= 1 }
        answers.insert(answer, at: index)
    }

    /// The earliest answer if it is due by `now`.
    mutating func popFirst(dueBy now: ContinuousClock.Instant) -> Answer? {
        guard head < answers.count, answers[head].due <= now else { return nil }
        let answer = answers[head]
        head += 1
        if head == answers.count {
            answers.removeAll(keepingCapacity: true)
            head = 0
        } else if head >= 256 && head * 2 >= answers.count {
            answers.removeFirst(head)
            head = 0
        }
        return answer
    }

    mutating func remove(streamID: Int32) {
        answers = answers[head...].filter { $0.streamID != streamID }
        head = 0
    }

    mutating func removeAll() {
        answers.removeAll()
        head = 0
    }
}
