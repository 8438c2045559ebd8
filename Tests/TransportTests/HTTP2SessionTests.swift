import Foundation
import Testing
@testable import Transport

/// A client and a server `HTTP2Session` exchanging bytes in memory: the server side's request
/// limits as state, without sockets.
private final class SessionPair {
    final class Seen {
        var server: [HTTP2Session.Event] = []
        var client: [HTTP2Session.Event] = []
    }

    let seen = Seen()
    let server: HTTP2Session
    let client: HTTP2Session

    init(maximumBody: Int) throws {
        let seen = seen
        server = try HTTP2Session(role: .server, maximumBody: maximumBody) { seen.server.append($0) }
        client = try HTTP2Session(role: .client) { seen.client.append($0) }
    }

    /// Moves bytes both ways until neither side has any to send; `keep` decides which of the
    /// client's frames (by type) reach the server.
    func pump(keep: (_ frameType: UInt8) -> Bool = { _ in true }) throws {
        for _ in 0..<50 {
            let fromClient = Self.frames(client.output(), keep: keep)
            let fromServer = server.output()
            if fromClient.isEmpty && fromServer.isEmpty { return }
            try fromClient.withUnsafeBytes { try server.receive($0) }
            try fromServer.withUnsafeBytes { try client.receive($0) }
        }
    }

    /// The status of the client's answer on `streamID`, once it came.
    func answer(on streamID: Int32) -> HTTP2Session.Message? {
        for case .message(let id, let message) in seen.client where id == streamID { return message }
        return nil
    }

    private static func frames(_ bytes: [UInt8], keep: (UInt8) -> Bool) -> [UInt8] {
        let preface = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)
        var kept: [UInt8] = bytes.starts(with: preface) ? preface : []
        var offset = kept.count
        while offset + 9 <= bytes.count {
            let length = Int(bytes[offset]) << 16 | Int(bytes[offset + 1]) << 8 | Int(bytes[offset + 2])
            let end = min(bytes.count, offset + 9 + length)
            if keep(bytes[offset + 3]) { kept += bytes[offset..<end] }
            offset = end
        }
        return kept
    }
}

@Suite struct HTTP2SessionTests {
    private static func request(body: Int) -> HTTP2Session.Message {
        HTTP2Session.Message(headers: [(":method", "POST"), (":scheme", "https"), (":authority", "x"), (":path", "/"),
                                       ("content-length", String(body))], body: [UInt8](repeating: 0x61, count: body))
    }

    @Test func aServerIsToldOfABodyOverItsLimitAndCanAnswerItWhileItStillArrives() throws {
        let pair = try SessionPair(maximumBody: 1000)
        let big = try pair.client.submitRequest(Self.request(body: 5000))
        let small = try pair.client.submitRequest(Self.request(body: 10))
        try pair.pump()
        // The large one is the server's to answer (no reset); the small one arrived whole.
        #expect(pair.seen.server.contains { if case .bodyTooLarge(big) = $0 { true } else { false } })
        #expect(pair.seen.server.contains { if case .message(small, let message) = $0 { message.body.count == 10 } else { false } })
        #expect(!pair.seen.server.contains { if case .message(big, _) = $0 { true } else { false } })
        pair.server.submitResponse(HTTP2Session.Message(headers: [(":status", "413")], body: []), on: big)
        try pair.pump()
        #expect(pair.answer(on: big)?.header(":status") == "413")
    }

    @Test func requestsStillArrivingAreAbandonedByAgeAndTheirLateBytesDropped() throws {
        let pair = try SessionPair(maximumBody: 1 << 20)
        #expect(pair.server.oldestArrivalStart == nil)
        let stream = try pair.client.submitRequest(Self.request(body: 100))
        // Everything but the body: the request is arriving, not complete.
        try pair.pump { $0 != 0 }
        let started = try #require(pair.server.oldestArrivalStart)
        #expect(pair.server.abandonArrivals(startedBefore: started) == [])
        #expect(pair.server.abandonArrivals(startedBefore: started + .nanoseconds(1)) == [stream])
        #expect(pair.server.oldestArrivalStart == nil)
        pair.server.submitResponse(HTTP2Session.Message(headers: [(":status", "408")], body: []), on: stream)
        try pair.pump()
        #expect(pair.answer(on: stream)?.header(":status") == "408")
        // The body the client still had to send is dropped, never a request of its own.
        #expect(!pair.seen.server.contains { if case .message = $0 { true } else { false } })
    }
}
