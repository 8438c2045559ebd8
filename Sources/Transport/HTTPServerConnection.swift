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
    private let observer: HTTPServerObserver
    private let mailbox = HTTPReplyMailbox()
    private let onEnd: (@Sendable () -> Void)?
    /// The loop serving it, from `serve` until it ends (loop thread only after `serve`).
    private var loop: StreamLoop?
    /// The handshake is done (a connection that ends before timed out or failed in it).
    private var opened = false
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
    private var http1: HTTP1RequestParser?
    /// HTTP/1.1: a request is being answered (the next waits in the reader).
    private var http1Busy = false
    /// HTTP/1.1: requests are being taken from the reader now (an answer given meanwhile
    /// lets the loop there go on rather than start another: no recursion per pipelined request).
    private var takingHTTP1Requests = false
    /// HTTP/1.1: requests may wait in the reader that were left there while the output was
    /// full; taken once it has room.
    private var http1WaitsForOutput = false
    /// HTTP/2: the highest stream handed to the handler (a GOAWAY names it).
    private var lastProcessedStreamID: Int32 = 0
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
    package init(limits: HTTPServerLimits = HTTPServerLimits(), observer: HTTPServerObserver = HTTPServerObserver(),
                 onEnd: (@Sendable () -> Void)? = nil, batchHandler: @escaping BatchHandler) {
        handling = .batch(batchHandler)
        self.limits = limits
        self.observer = observer
        self.onEnd = onEnd
    }

    /// One request at a time.
    package init(limits: HTTPServerLimits = HTTPServerLimits(), observer: HTTPServerObserver = HTTPServerObserver(),
                 onEnd: (@Sendable () -> Void)? = nil, handler: @escaping Handler) {
        handling = .single(handler)
        self.limits = limits
        self.observer = observer
        self.onEnd = onEnd
    }

    /// Starts serving an accepted socket on `eventLoop`, or (nil) on a thread of its own; a
    /// nil `context` serves it plain. `register` gets the connection's mailbox before it
    /// starts (`HTTPServer` asks it to go away through it).
    /// - Throws: `TransportError` when no loop can be made for it (out of descriptors): the
    ///   caller closes `fd`.
    package func serve(fd: Int32, context: TLSContext?, name: String, on eventLoop: EventLoop? = nil,
                       register: (HTTPReplyMailbox) -> Void = { _ in }) throws(TransportError) {
        let loop = try StreamLoop(name: name, origin: .accepted(fd: fd), tlsContext: context, role: .server,
                                  handshakeTimeout: limits.handshakeTimeout, outboundCapacity: 1 << 20, on: eventLoop, driver: self)
        self.loop = loop
        mailbox.attach(loop)
        register(mailbox)
        loop.start()
    }

    /// Starts serving an accepted socket on a thread of its own (closing it when it cannot).
    package static func serve(fd: Int32, context: TLSContext, name: String, maximumConcurrentStreams: UInt32 = 100,
                              handler: @escaping Handler) {
        do {
            try HTTPServerConnection(limits: HTTPServerLimits(maximumConcurrentStreams: maximumConcurrentStreams), handler: handler)
                .serve(fd: fd, context: context, name: name)
        } catch {
            close(fd)
        }
    }

    package func streamDidOpen(_ loop: StreamLoop) {
        opened = true
        lastActivity = .now
        switch loop.negotiatedProtocol {
        case "h2": startHTTP2(loop)
        case nil: sniffed = []
        default: startHTTP1()
        }
    }

    private func startHTTP1() {
        http1 = HTTP1RequestParser(maximumHeadBytes: limits.maximumHeadBytes, maximumBodyBytes: limits.maximumBodyBytes)
    }

    private func startHTTP2(_ loop: StreamLoop) {
        do {
            session = try HTTP2Session(role: .server, maximumConcurrentStreams: limits.maximumConcurrentStreams,
                                       maximumBody: limits.maximumBodyBytes, maximumHeaderListBytes: limits.maximumHeadBytes) { [unowned self] event in
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
                startHTTP1()
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
            http1!.append(bytes)
            takeHTTP1Requests(loop)
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
        if http1WaitsForOutput { takeHTTP1Requests(loop) }
        if loop.isEnded || loop.isClosing { return }
        checkTimeouts(now: now, loop: loop)
        flush(loop)
    }

    /// Not while the peer leaves answers unread past the bound, nor (HTTP/1.1) while a
    /// request is being answered and a head's worth of what follows it is here already.
    package var wantsToRead: Bool {
        guard let loop else { return true }
        if loop.pendingOutputBytes >= limits.maximumPendingOutputBytes { return false }
        if let http1, http1Busy || http1WaitsForOutput, http1.bufferedByteCount >= limits.maximumHeadBytes { return false }
        return true
    }

    /// HTTP/1.1 requests left in the reader while the output was full, once it has room.
    package var wantsAnotherTurn: Bool {
        guard http1WaitsForOutput, !http1Busy, let loop else { return false }
        return loop.pendingOutputBytes < limits.maximumPendingOutputBytes
    }

    package func nextDeadline(_ loop: StreamLoop) -> ContinuousClock.Instant? {
        var deadline = scheduled.firstDue
        // A server with neither timeout (the simulators) never looks at its streams; one with
        // both looks once.
        let arriving = limits.requestTimeout != nil || limits.idleTimeout != nil ? session?.oldestArrivalStart : nil
        if let timeout = limits.requestTimeout, let started = http1RequestStarted ?? arriving {
            deadline = min(deadline ?? started + timeout, started + timeout)
        }
        if let due = idleDeadline(loop, arriving: arriving) {
            deadline = min(deadline ?? due, due)
        }
        return deadline
    }

    /// When the connection counts as idle, if nothing happens before: no request under way
    /// or arriving. HTTP/1.1's bytes are all requests; HTTP/2's PINGs, SETTINGS and
    /// WINDOW_UPDATEs are not, so a client cannot hold its connection with them.
    /// - Parameter arriving: when the oldest HTTP/2 request still arriving began, when the
    ///   caller looked already (`.some(nil)`: none is).
    private func idleDeadline(_ loop: StreamLoop, arriving: ContinuousClock.Instant?? = .none) -> ContinuousClock.Instant? {
        guard let idle = limits.idleTimeout, unanswered == 0 else { return nil }
        if let session {
            guard (arriving ?? session.oldestArrivalStart) == nil else { return nil }
            return lastActivity + idle
        }
        return max(lastActivity, loop.lastReadAt) + idle
    }

    package func streamDidEnd(_ loop: StreamLoop, reason: any Error) {
        if !opened, let error = reason as? TransportError, error == .handshakeTimedOut { observer.timedOut("handshake") }
        self.loop = nil
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
                observer.refusedRequest(408, "request_timeout")
                observer.timedOut("request")
                let body = Array(#"{"error":{"code":408,"status":"request_timeout","message":"the request did not arrive in time"}}"#.utf8)
                session.submitResponse(HTTP2Session.Message(headers: [(":status", "408"), ("content-type", "application/json"),
                                                                      ("content-length", String(body.count))], body: body), on: streamID)
            }
        }
        if let started = http1RequestStarted, let timeout = limits.requestTimeout, !http1Busy, now >= started + timeout {
            observer.timedOut("request")
            refuseHTTP1(HTTP1RequestParser.Refusal(status: 408, reason: "request_timeout", message: "the request did not arrive in time"),
                        loop: loop, closing: TransportError.timedOut("a request that did not arrive in time"))
            return
        }
        if let due = idleDeadline(loop), now >= due {
            observer.timedOut("idle")
            if let session {
                session.goAway(lastStreamID: lastProcessedStreamID)
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
            // Every stream handed over so far was processed (answered already or not).
            goAwayLastStreamID = max(openStreams.max() ?? 0, lastProcessedStreamID)
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
            lastProcessedStreamID = max(lastProcessedStreamID, streamID)
            lastActivity = .now
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
            unanswered += 1
            if let repeated = HTTPServerRequest.repeatedSingleton(in: headers) {
                // Answered here, as HTTP/1.1 is: a request no two readers would read alike.
                observer.refusedRequest(400, "malformed_http")
                send(Self.refusal(status: 400, reason: "malformed_http", message: "more than one \(repeated) field"), on: streamID,
                     then: .keepOpen, loop: loop)
                return
            }
            let request = HTTPServerRequest(method: method, path: path, headerList: headers, body: message.body, protocolName: "h2",
                                            reply: HTTPServerReply(mailbox: mailbox, streamID: streamID))
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
            observer.refusedRequest(413, "too_large")
            let body = Array(#"{"error":{"code":413,"status":"too_large","message":"the body is over \#(limits.maximumBodyBytes) bytes"}}"#.utf8)
            session?.submitResponse(HTTP2Session.Message(headers: [(":status", "413"), ("content-type", "application/json"),
                                                                   ("content-length", String(body.count))], body: body), on: streamID)
        case .headersTooLarge:
            // Reset by the session already (nothing of the stream is kept).
            observer.refusedRequest(431, "header_too_large")
        }
    }

    /// The JSON answer of a request the HTTP layer refuses.
    static func refusal(status: Int, reason: String, message: String) -> HTTPServerResponse {
        var body = #"{"error":{"code":"# + String(status) + #","status":""# + reason + #"","message":"#
        appendJSONString(message, to: &body)
        body += "}}"
        return HTTPServerResponse(status: status, headers: [("content-type", "application/json")], body: Array(body.utf8))
    }

    private static func appendJSONString(_ text: String, to body: inout String) {
        body += "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": body += "\\\""
            case "\\": body += "\\\\"
            case _ where scalar.value < 0x20: body += String(format: "\\u%04x", scalar.value)
            default: body.unicodeScalars.append(scalar)
            }
        }
        body += "\""
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
                takeHTTP1Requests(loop)
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
        case 431: "Request Header Fields Too Large"
        case 500: "Internal Server Error"
        case 501: "Not Implemented"
        case 503: "Service Unavailable"
        case 505: "HTTP Version Not Supported"
        default: status < 400 ? "OK" : "Error"
        }
    }

    /// Takes the requests waiting in the reader, one after another (in a loop, never by
    /// recursion: a client may pipeline thousands in one write), each answered before the
    /// next is taken; stops while one waits for its answer, or while the output is over its
    /// bound (the rest wait in the reader, and reading stops once a head's worth waits).
    private func takeHTTP1Requests(_ loop: StreamLoop) {
        guard !takingHTTP1Requests else { return }
        takingHTTP1Requests = true
        defer { takingHTTP1Requests = false }
        http1WaitsForOutput = false
        while !http1Busy, !loop.isEnded, !loop.isClosing, http1 != nil {
            guard loop.pendingOutputBytes < limits.maximumPendingOutputBytes else {
                http1WaitsForOutput = http1!.bufferedByteCount > 0
                return
            }
            let request: HTTP1RequestParser.Request
            do {
                guard let next = try http1!.next() else {
                    if http1!.takeContinueRequest() {
                        loop.write(bytes: Array("HTTP/1.1 100 Continue\r\n\r\n".utf8), recordSize: StreamLoop.recordSize)
                    }
                    if !http1!.isMidRequest { http1RequestStarted = nil }
                    return
                }
                request = next
            } catch {
                observer.refusedRequest(error.status, error.reason)
                refuseHTTP1(error, loop: loop, closing: TransportError.connectionLost("a malformed request (\(error.message))"))
                return
            }
            http1Busy = true
            http1RequestStarted = http1!.isMidRequest ? .now : nil
            if !request.keepsAlive { http1GoAway = true }
            unanswered += 1
            let served = HTTPServerRequest(method: request.method, path: request.target, headerList: request.headers, body: request.body,
                                           protocolName: "http/1.1", reply: HTTPServerReply(mailbox: mailbox, streamID: 0))
            let action: HTTPServerAction
            switch handling {
            case .single(let handler): action = handler(served)
            case .batch(let handler):
                action = handler([served]).first ?? .respond(HTTPServerResponse(status: 500, headers: [("content-type", "text/plain")],
                                                                                body: Array("no answer".utf8)))
            }
            carryOut(action, streamID: 0, processedThrough: 0, loop: loop)
        }
    }

    /// Answers a request the HTTP layer refuses and closes (the reader cannot find where the
    /// next request would begin).
    private func refuseHTTP1(_ refusal: HTTP1RequestParser.Refusal, loop: StreamLoop, closing reason: any Error) {
        let response = Self.refusal(status: refusal.status, reason: refusal.reason, message: refusal.message)
        var headers: [String: String] = ["connection": "close"]
        for (name, value) in response.headers { headers[name] = value }
        let message = HTTPMessage(startLine: ["HTTP/1.1", String(refusal.status), Self.reasonPhrase(refusal.status)], headers: headers,
                                  body: response.body)
        loop.write(bytes: message.serialized(), recordSize: StreamLoop.recordSize)
        http1 = nil
        loop.close(reason: reason)
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
