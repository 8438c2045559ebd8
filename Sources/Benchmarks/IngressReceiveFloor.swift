import Foundation
import Transport

/// The least CPU the HTTPS ingress's transport can cost per request with the libraries it
/// is built on: the TLS records devices' HTTP/2 connections sent, decrypted by the
/// worker's TLS layer, received by its HTTP/2 session (libnghttp2: frames, HPACK, flow
/// control, and the request handed over as headers and body), a 200 answer of the
/// ingress's form submitted for each, and the answers encrypted. All on the calling
/// thread: no socket, poll, token check, body parse, queue or database. What the ingress
/// spends per message beyond this is its own work (the upstream benchmark's `floor` phase
/// prints it beside the CCS path's whole cost).
package enum IngressReceiveFloor {
    /// One request as a device sends it.
    package struct Request: Sendable {
        package var path: String
        package var headers: [(name: String, value: String)]
        package var body: [UInt8]

        package init(path: String, headers: [(name: String, value: String)], body: [UInt8]) {
            self.path = path
            self.headers = headers
            self.body = body
        }
    }

    /// TLS records a client wrote on one connection, waiting to be replayed once into the
    /// server end they were encrypted for (its keys and record numbers move on as it reads).
    package final class Recording {
        fileprivate let server: TLSMemoryStream
        /// What each socket read would have returned: the records of one window of requests.
        fileprivate let reads: [[UInt8]]
        /// The requests recorded.
        package let requests: Int
        /// The records' size, in bytes.
        package var bytes: Int { reads.reduce(0) { $0 + $1.count } }
        fileprivate var replayed = false

        fileprivate init(server: TLSMemoryStream, reads: [[UInt8]], requests: Int) {
            self.server = server
            self.reads = reads
            self.requests = requests
        }
    }

    /// What a replay produced.
    package struct Outcome: Sendable {
        /// Requests received whole (and answered).
        package var requests = 0
        /// Request body bytes received.
        package var bodyBytes = 0
        /// TLS bytes the answers (and the session's own frames) became.
        package var answerRecordBytes = 0
        /// The requests received, when kept (`keepingRequests`).
        package var received: [HTTP2Session.Message] = []

        /// Nothing yet (a sum of replays starts here).
        package init() {}

        /// Adds `other`'s counts.
        package mutating func add(_ other: Outcome) {
            requests += other.requests
            bodyBytes += other.bodyBytes
            answerRecordBytes += other.answerRecordBytes
            received += other.received
        }
    }

    /// The answer the ingress gives a request in immediate mode, as the floor submits it.
    static func answer(to request: HTTP2Session.Message) -> HTTP2Session.Message {
        let body = Array(#"{"message_id":"floor","status":"accepted"}"#.utf8)
        return HTTP2Session.Message(headers: [(":status", "200"), ("content-type", "application/json"),
                                              ("content-length", String(body.count))], body: body)
    }

    /// Encrypts `requests` as one client connection sends them: the connection preface and
    /// settings, then windows of `window` requests (streams open at once), each window's
    /// frames written together as TLS records of at most 16 KiB. A plaintext server session
    /// answers each window while recording, so that the client's streams, settings
    /// acknowledgements and flow-control frames are those of a real exchange.
    /// - Parameters:
    ///   - server: the ingress's TLS context; `client` the devices', trusting it as `serverName`.
    package static func record(requests: [Request], window: Int = 100, server: TLSContext, client: TLSContext,
                               serverName: String) throws -> Recording {
        let clientEnd = try TLSMemoryStream(context: client, role: .client(serverName: serverName))
        let serverEnd = try TLSMemoryStream(context: server, role: .server)
        try TLSMemoryStream.handshake(client: clientEnd, server: serverEnd)
        var answered = 0
        let clientSession = try HTTP2Session(role: .client) { event in
            if case .message = event { answered += 1 }
        }
        var arrived: [(Int32, HTTP2Session.Message)] = []
        let recordingServer = try HTTP2Session(role: .server) { event in
            if case .message(let streamID, let message) = event { arrived.append((streamID, message)) }
        }
        var reads: [[UInt8]] = []
        var start = 0
        while start < requests.count {
            let end = min(requests.count, start + max(1, window))
            for request in requests[start..<end] {
                let headers = [(":method", "POST"), (":scheme", "https"), (":authority", serverName), (":path", request.path)] + request.headers
                _ = try clientSession.submitRequest(HTTP2Session.Message(headers: headers, body: request.body))
            }
            let sent = clientSession.output()
            var offset = 0
            while offset < sent.count {
                let length = min(StreamLoop.recordSize, sent.count - offset)
                try sent.withUnsafeBytes { try clientEnd.write(UnsafeRawBufferPointer(rebasing: $0[offset..<(offset + length)])) }
                offset += length
            }
            reads.append(clientEnd.takeRecords())
            // The recording server answers the window, so the client may open the next.
            try sent.withUnsafeBytes { try recordingServer.receive($0) }
            for (streamID, message) in arrived { recordingServer.submitResponse(answer(to: message), on: streamID) }
            arrived.removeAll(keepingCapacity: true)
            let answers = recordingServer.output()
            try answers.withUnsafeBytes { try clientSession.receive($0) }
            start = end
        }
        guard answered == requests.count else {
            throw TransportError.connectionLost("the floor's recording answered \(answered) of \(requests.count) requests")
        }
        return Recording(server: serverEnd, reads: reads, requests: requests.count)
    }

    /// Replays `recording` through a fresh server session, on this thread. A recording
    /// replays once (its server end has read its records then).
    /// - Parameter keepingRequests: keep the requests received in the outcome (tests).
    /// - Throws: `TransportError` when a record cannot be decrypted or the frames break
    ///   the protocol.
    package static func replay(_ recording: Recording, keepingRequests: Bool = false) throws -> Outcome {
        precondition(!recording.replayed, "a floor recording replays once")
        recording.replayed = true
        var outcome = Outcome()
        var arrived: [(Int32, HTTP2Session.Message)] = []
        let session = try HTTP2Session(role: .server) { event in
            if case .message(let streamID, let message) = event { arrived.append((streamID, message)) }
        }
        var buffer = [UInt8](repeating: 0, count: StreamLoop.recordSize)
        for read in recording.reads {
            recording.server.receive(read)
            while true {
                let count = try buffer.withUnsafeMutableBytes { try recording.server.read(into: $0) }
                if count == 0 { break }
                try buffer.withUnsafeBytes { try session.receive(UnsafeRawBufferPointer(rebasing: $0.prefix(count))) }
            }
            for (streamID, message) in arrived {
                outcome.requests += 1
                outcome.bodyBytes += message.body.count
                if keepingRequests { outcome.received.append(message) }
                session.submitResponse(answer(to: message), on: streamID)
            }
            arrived.removeAll(keepingCapacity: true)
            let answers = session.output()
            try answers.withUnsafeBytes { try recording.server.write($0) }
            outcome.answerRecordBytes += recording.server.discardRecords()
        }
        return outcome
    }
}
