import Foundation
import Runtime

/// The server side of one HTTP connection, HTTP/2 or HTTP/1.1 as ALPN chose (on a plain
/// connection, HTTP/2 when the client opens with its preface: prior knowledge, h2c): the
/// driver of its stream loop. Each complete request is handed to `handler` (on the loop's
/// thread; it must not block) and its action carried out, answers after a delay or from
/// another thread (`later`) included.
///
/// `@unchecked Sendable`: its state is touched only on its loop's thread (the `StreamDriver`
/// contract); other threads reach it only through its `HTTPReplyMailbox`.
package final class HTTPServerConnection: StreamDriver, @unchecked Sendable {
    package typealias Handler = @Sendable (HTTPServerRequest) -> HTTPServerAction
    /// Takes the requests one read of the connection completed, in the order they came,
    /// and returns an action for each, in the same order: a server that hands work on (the
    /// ingress) does so once per read rather than once per request.
    package typealias BatchHandler = @Sendable ([HTTPServerRequest]) -> [HTTPServerAction]

    private enum Handling {
        /// Each request as soon as it is parsed (a GOAWAY it asks for refuses the streams
        /// after it, even those of the same read).
        case single(Handler)
        /// The requests of a read together, once it is parsed.
        case batch(BatchHandler)
    }

    private let handling: Handling
    private let limits: HTTPServerLimits
    private let mailbox = HTTPReplyMailbox()
    private let onEnd: (@Sendable () -> Void)?
    private static let preface = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)
    // Loop thread only.
    /// A plain connection's first bytes, until they show whether it is HTTP/2 (its preface)
    /// or HTTP/1.1.
    private var sniffed: [UInt8]?
    /// HTTP/1.1: when the first bytes of the request now arriving came (`requestTimeout`).
    private var http1RequestStarted: ContinuousClock.Instant?
    /// Requests handed to the handler and not answered yet.
    private var unanswered = 0
    private var lastActivity = ContinuousClock.now
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
    /// HTTP/1.1: close after the answer under way.
    private var http1GoAway = false
    /// HTTP/2: the requests completed by the bytes being read, handed over together once
    /// they are all parsed.
    private var received: [(request: HTTPServerRequest, streamID: Int32)] = []
    /// HTTP/2: answers are being submitted together; their frames go out in one write after.
    private var submittingTogether = false

    /// - Parameter onEnd: called once the connection has ended (on its thread).
    package init(limits: HTTPServerLimits = HTTPServerLimits(), onEnd: (@Sendable () -> Void)? = nil, batchHandler: @escaping BatchHandler) {
        handling = .batch(batchHandler)
        self.limits = limits
        self.onEnd = onEnd
    }

    /// One request at a time.
    package init(limits: HTTPServerLimits = HTTPServerLimits(), onEnd: (@Sendable () -> Void)? = nil, handler: @escaping Handler) {
        handling = .single(handler)
        self.limits = limits
        self.onEnd = onEnd
    }

    /// Starts serving an accepted socket on a thread of its own; a nil `context` serves it
    /// plain. `register` gets the connection's mailbox before it starts (`HTTPServer` asks
    /// it to go away through it).
    package func serve(fd: Int32, context: TLSContext?, name: String, register: (HTTPReplyMailbox) -> Void = { _ in }) {
        let loop = StreamLoop(name: name, origin: .accepted(fd: fd), tlsContext: context, role: .server, handshakeTimeout: .seconds(10),
                              outboundCapacity: 1 << 20, driver: self)
        mailbox.attach(loop)
        register(mailbox)
        loop.start()
    }

    /// Starts serving an accepted socket on a thread of its own.
    package static func serve(fd: Int32, context: TLSContext, name: String, maximumConcurrentStreams: UInt32 = 100,
                              handler: @escaping Handler) {
        HTTPServerConnection(limits: HTTPServerLimits(maximumConcurrentStreams: maximumConcurrentStreams), handler: handler)
            .serve(fd: fd, context: context, name: name)
    }

    package func streamDidOpen(_ loop: StreamLoop) {
        lastActivity = .now
        switch loop.negotiatedProtocol {
        case "h2": startHTTP2(loop)
        case nil: sniffed = []
        default: http1 = HTTPMessageReader(maximumBodyBytes: limits.maximumBodyBytes)
        }
    }

    private func startHTTP2(_ loop: StreamLoop) {
        do {
            session = try HTTP2Session(role: .server, maximumConcurrentStreams: limits.maximumConcurrentStreams,
                                       maximumBody: limits.maximumBodyBytes) { [unowned self] event in
                handle(event, loop: loop)
            }
        } catch {
            loop.abort(reason: error)
            return
        }
        flush(loop)
    }

    package func stream(_ loop: StreamLoop, didRead bytes: UnsafeRawBufferPointer) {
        if sniffed != nil {
            sniffed!.append(contentsOf: bytes.bindMemory(to: UInt8.self))
            let seen = sniffed!
            if seen.count < Self.preface.count && Self.preface.starts(with: seen) { return }
            sniffed = nil
            if seen.starts(with: Self.preface) {
                startHTTP2(loop)
            } else {
                http1 = HTTPMessageReader(maximumBodyBytes: limits.maximumBodyBytes)
            }
            seen.withUnsafeBytes { stream(loop, didRead: $0) }
            return
        }
        if let session {
            do {
                try session.receive(bytes)
            } catch {
                loop.abort(reason: error)
                return
            }
            handleReceived(loop)
            flush(loop)
        } else if http1 != nil {
            if http1RequestStarted == nil { http1RequestStarted = .now }
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
        let (replies, goAway) = mailbox.take()
        // HTTP/2: the answers posted since the last turn leave in one write (the flush below).
        submittingTogether = session != nil
        for reply in replies {
            send(reply.response, on: reply.streamID, then: goAway ? .goAway : .keepOpen, loop: loop)
            if loop.isEnded { return }
        }
        submittingTogether = false
        if !replies.isEmpty && session != nil { flush(loop) }
        if goAway { beginGoingAway(loop) }
        if loop.isEnded || loop.isClosing { return }
        checkTimeouts(now: now, loop: loop)
        flush(loop)
    }

    package var wantsToRead: Bool { true }

    package func nextDeadline(_ loop: StreamLoop) -> ContinuousClock.Instant? {
        var deadline = scheduled.firstDue
        // The timeout first: a server without one (the simulators) never looks at its streams.
        if let timeout = limits.requestTimeout, let started = http1RequestStarted ?? session?.oldestArrivalStart {
            deadline = min(deadline ?? started + timeout, started + timeout)
        }
        if let idle = limits.idleTimeout, unanswered == 0 {
            let due = max(lastActivity, loop.lastReadAt) + idle
            deadline = min(deadline ?? due, due)
        }
        return deadline
    }

    package func streamDidEnd(_ loop: StreamLoop, reason: any Error) {
        session = nil
        scheduled.removeAll()
        streamsAwaitingAnswers.removeAll()
        mailbox.detach()
        onEnd?()
    }

    /// A slow request gets 408 (HTTP/1.1: and the connection closes; HTTP/2: the stream is
    /// answered, the rest of its body dropped); an idle connection closes.
    private func checkTimeouts(now: ContinuousClock.Instant, loop: StreamLoop) {
        if let session, let timeout = limits.requestTimeout {
            for streamID in session.abandonArrivals(startedBefore: now - timeout) {
                let body = Array(#"{"error":{"code":408,"status":"request_timeout","message":"the request did not arrive in time"}}"#.utf8)
                session.submitResponse(HTTP2Session.Message(headers: [(":status", "408"), ("content-type", "application/json"),
                                                                      ("content-length", String(body.count))], body: body), on: streamID)
            }
        }
        if let started = http1RequestStarted, let timeout = limits.requestTimeout, !http1Busy, now >= started + timeout {
            let refusal = HTTPMessage(startLine: ["HTTP/1.1", "408", "Request Timeout"],
                                      headers: ["connection": "close", "content-type": "application/json"],
                                      body: Array(#"{"error":{"code":408,"status":"request_timeout","message":"the request did not arrive in time"}}"#.utf8))
            loop.write(bytes: refusal.serialized(), recordSize: StreamLoop.recordSize)
            loop.close(reason: TransportError.timedOut("a request that did not arrive in time"))
            return
        }
        if let idle = limits.idleTimeout, unanswered == 0, now >= max(lastActivity, loop.lastReadAt) + idle {
            if let session {
                session.goAway()
                flush(loop)
            }
            loop.close(reason: TransportError.timedOut("an idle connection"))
        }
    }

    /// Finishes the requests under way and closes: HTTP/2 sends a GOAWAY naming the last
    /// stream processed; HTTP/1.1 closes now when idle, else after the answer under way.
    private func beginGoingAway(_ loop: StreamLoop) {
        if let session {
            guard goAwayLastStreamID == nil else { return }
            goAwayLastStreamID = openStreams.max() ?? 0
            session.goAway(lastStreamID: goAwayLastStreamID)
            flush(loop)
        } else if !http1Busy {
            loop.close(reason: TransportError.closedByPeer)
        } else {
            http1GoAway = true
        }
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
            var method = "", path = ""
            var headers: [(name: String, value: String)] = []
            headers.reserveCapacity(message.headers.count)
            for (name, value) in message.headers {
                switch name {
                case ":method": method = value
                case ":path": path = value
                default: if !name.hasPrefix(":") { headers.append((name, value)) }
                }
            }
            let request = HTTPServerRequest(method: method, path: path, headerList: headers, body: message.body, protocolName: "h2",
                                            reply: HTTPServerReply(mailbox: mailbox, streamID: streamID))
            unanswered += 1
            switch handling {
            case .single(let handler): carryOut(handler(request), streamID: streamID, processedThrough: streamID, loop: loop)
            case .batch: received.append((request, streamID))
            }
        case .streamClosed(let streamID, _):
            openStreams.remove(streamID)
            // Closed before its answer was due (the client reset it): the answer is dropped.
            if streamsAwaitingAnswers.remove(streamID) != nil { scheduled.remove(streamID: streamID) }
            closeIfDone(loop)
        case .goAway:
            break
        case .bodyTooLarge(let streamID):
            // Answered at once: the client may stop sending (what it still sends is dropped).
            if let last = goAwayLastStreamID, streamID > last { return }
            // Submitted only: the frames go out when the read that brought the body is done.
            let body = Array(#"{"error":{"code":413,"status":"too_large","message":"the body is over \#(limits.maximumBodyBytes) bytes"}}"#.utf8)
            session?.submitResponse(HTTP2Session.Message(headers: [(":status", "413"), ("content-type", "application/json"),
                                                                   ("content-length", String(body.count))], body: body), on: streamID)
        }
    }

    /// Hands the requests the last read completed to the handler, and carries out its actions.
    private func handleReceived(_ loop: StreamLoop) {
        guard !received.isEmpty, case .batch(let handler) = handling else { return }
        let batch = received
        received.removeAll(keepingCapacity: true)
        let actions = handler(batch.map(\.request))
        // Every request of the batch was processed, whatever the handler says about the others.
        let processedThrough = batch.map(\.streamID).max() ?? 0
        // The answers given now leave in one write (the caller flushes after).
        submittingTogether = true
        defer { submittingTogether = false }
        for (index, item) in batch.enumerated() {
            let action = index < actions.count ? actions[index]
                : .respond(HTTPServerResponse(status: 500, headers: [("content-type", "text/plain")], body: Array("no answer".utf8)))
            carryOut(action, streamID: item.streamID, processedThrough: processedThrough, loop: loop)
            if loop.isEnded { return }
        }
    }

    /// - Parameter processedThrough: the highest stream the handler has seen (a GOAWAY names it).
    private func carryOut(_ action: HTTPServerAction, streamID: Int32, processedThrough: Int32, loop: StreamLoop) {
        switch action {
        case .respond(let response, let delay, let then):
            if then == .goAway, let session, goAwayLastStreamID == nil {
                // At once: every stream processed so far has an id up to `processedThrough`.
                goAwayLastStreamID = processedThrough
                session.goAway(lastStreamID: processedThrough)
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
        case .hold, .later:
            break
        }
    }

    private func send(_ response: HTTPServerResponse, on streamID: Int32, then: HTTPServerAction.Afterwards, loop: StreamLoop) {
        unanswered = max(0, unanswered - 1)
        lastActivity = .now
        if let session {
            var headers: [(name: String, value: String)] = [(":status", String(response.status))]
            headers += response.headers
            headers.append(("content-length", String(response.body.count)))
            session.submitResponse(HTTP2Session.Message(headers: headers, body: response.body), on: streamID)
            if !submittingTogether { flush(loop) }
        } else {
            var headers: [String: String] = [:]
            for (name, value) in response.headers { headers[name] = value }
            let then: HTTPServerAction.Afterwards = http1GoAway ? .goAway : then
            if then == .goAway { headers["connection"] = "close" }
            let message = HTTPMessage(startLine: ["HTTP/1.1", String(response.status), Self.reasonPhrase(response.status)],
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

    /// The reason phrase of a status line.
    static func reasonPhrase(_ status: Int) -> String {
        switch status {
        case 200: "OK"
        case 202: "Accepted"
        case 400: "Bad Request"
        case 401: "Unauthorized"
        case 403: "Forbidden"
        case 404: "Not Found"
        case 405: "Method Not Allowed"
        case 408: "Request Timeout"
        case 413: "Content Too Large"
        case 415: "Unsupported Media Type"
        case 429: "Too Many Requests"
        case 500: "Internal Server Error"
        case 503: "Service Unavailable"
        default: status < 400 ? "OK" : "Error"
        }
    }

    private func nextHTTP1Request(_ loop: StreamLoop) {
        guard !http1Busy, !loop.isEnded, !loop.isClosing else { return }
        let message: HTTPMessage
        do {
            guard let next = try http1?.next() else {
                if http1?.takeContinueRequest() == true {
                    loop.write(bytes: Array("HTTP/1.1 100 Continue\r\n\r\n".utf8), recordSize: StreamLoop.recordSize)
                }
                return
            }
            message = next
        } catch {
            let status = error.isTooLarge ? "413" : "400"
            let refusal = HTTPMessage(startLine: ["HTTP/1.1", status, error.isTooLarge ? "Content Too Large" : "Bad Request"],
                                      headers: ["connection": "close", "content-type": "application/json"],
                                      body: Array(#"{"error":{"code":\#(status),"status":"\#(error.isTooLarge ? "too_large" : "malformed_http")"}}"#.utf8))
            loop.write(bytes: refusal.serialized(), recordSize: StreamLoop.recordSize)
            loop.close(reason: TransportError.connectionLost("a malformed request"))
            return
        }
        http1Busy = true
        http1RequestStarted = http1?.hasBufferedBytes == true ? .now : nil
        // HTTP/1.0 closes after the answer unless it asks to keep the connection; HTTP/1.1
        // keeps it unless it says close.
        let version = message.startLine.count > 2 ? message.startLine[2] : "HTTP/1.0"
        let connectionHeader = message.headers["connection"]?.lowercased() ?? ""
        if connectionHeader.contains("close") || (version == "HTTP/1.0" && !connectionHeader.contains("keep-alive")) {
            http1GoAway = true
        }
        unanswered += 1
        let request = HTTPServerRequest(method: message.startLine.first ?? "", path: message.startLine.count > 1 ? message.startLine[1] : "",
                                        headerList: message.headers.map { ($0.key, $0.value) }, body: message.body, protocolName: "http/1.1",
                                        reply: HTTPServerReply(mailbox: mailbox, streamID: 0))
        let action: HTTPServerAction
        switch handling {
        case .single(let handler): action = handler(request)
        case .batch(let handler):
            action = handler([request]).first ?? .respond(HTTPServerResponse(status: 500, headers: [("content-type", "text/plain")],
                                                                             body: Array("no answer".utf8)))
        }
        carryOut(action, streamID: 0, processedThrough: 0, loop: loop)
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
