import Foundation
import Runtime
import Synchronization
import Testing
@testable import Transport

/// `HTTPServer` under a hostile client, as raw bytes on loopback: pipelined floods, peers
/// that never read, HPACK bombs, PINGs to stay open, repeated singleton fields. None crashes
/// the server or makes a connection's memory grow without bound.
@Suite struct HTTPServerEdgeTests {
    /// A plain server answering every request 200 at once.
    private static func server(limits: HTTPServerLimits = HTTPServerLimits(), observer: HTTPServerObserver = HTTPServerObserver(),
                               maximumConnections: Int = 64) throws -> HTTPServer {
        let server = try HTTPServer(host: "127.0.0.1", port: 0, tls: nil, name: "edge", limits: limits, maximumConnections: maximumConnections,
                                    observer: observer) { request in
            .respond(HTTPServerResponse(status: 200, headers: [("content-type", "text/plain")],
                                        body: Array("seen \(request.header("authorization") ?? "-")".utf8)))
        }
        server.start()
        return server
    }

    /// Thousands of requests pipelined in one write are answered one after another (each
    /// answer used to start the next request from inside itself: a stack overflow).
    @Test func thousandsOfPipelinedRequestsInOneWriteAreAllAnswered() throws {
        let server = try Self.server()
        defer { server.stop() }
        let peer = try RawPeer(port: server.port)
        let count = 5000
        let burst = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}" + String(repeating: "GET / HTTP/1.1\r\nHost: a\r\n\r\n", count: count)
        let writer = Thread { try? peer.write(burst) }
        writer.start()
        var received: [UInt8] = []
        var answers = 0
        let status = Array("HTTP/1.1 200 OK\r\n".utf8)
        while answers < count + 1, let bytes = peer.read(), !bytes.isEmpty {
            received += bytes
            answers = received.occurrences(of: status)
        }
        #expect(answers == count + 1)
    }

    /// A client that pipelines without reading its answers is read no further once they
    /// back up: what it sends stays in the sockets' buffers, the server's memory does not grow.
    @Test func aPipelinerThatNeverReadsIsNoLongerRead() throws {
        let server = try Self.server()
        defer { server.stop() }
        let peer = try RawPeer(port: server.port)
        let written = peer.writeWithoutReading(Array(String(repeating: "GET / HTTP/1.1\r\nHost: a\r\n\r\n", count: 1000).utf8), limit: 96 << 20)
        // The kernel's buffers on both sides take some megabytes; without backpressure the
        // server took all 96 MB, and held the answers to them.
        #expect(written < 32 << 20, "\(written) bytes taken from a client that reads nothing")
    }

    /// HTTP/2 PINGs sent without reading the PING ACKs: the same.
    @Test func anHTTP2PingFloodThatNeverReadsIsNoLongerRead() throws {
        let server = try Self.server()
        defer { server.stop() }
        let peer = try RawPeer(port: server.port)
        try peer.write(RawPeer.h2cOpening)
        var pings: [UInt8] = []
        for _ in 0..<1000 { pings += RawPeer.frame(type: 6, [0, 1, 2, 3, 4, 5, 6, 7]) }
        let written = peer.writeWithoutReading(pings, limit: 96 << 20)
        #expect(written < 32 << 20, "\(written) bytes of PINGs taken from a client that reads nothing")
    }

    /// One 4 KB field in HPACK's dynamic table and 16,000 one-byte references to it (64 MB
    /// decoded): the stream is reset as soon as its list passes the limit, and the
    /// connection goes on serving.
    @Test func anHPACKBombResetsItsStream() throws {
        let refused = Atomic(0)
        let server = try Self.server(observer: HTTPServerObserver(refusedRequest: { status, _ in
            if status == 431 { refused.add(1, ordering: .relaxed) }
        }))
        defer { server.stop() }
        let peer = try RawPeer(port: server.port)
        // Stream 1: a request whose last field (x-bomb, 4,000 bytes) enters the dynamic table (index 62).
        var first = RawPeer.getRoot + [0x40, 0x06] + Array("x-bomb".utf8) + [0x7F, 0xA1, 0x1E]
        first += [UInt8](repeating: 0x62, count: 4000)
        var bomb = RawPeer.getRoot
        bomb += [UInt8](repeating: 0xBE, count: 16_000)
        try peer.write(RawPeer.h2cOpening + RawPeer.frame(type: 1, flags: 0x5, streamID: 1, first)
                       + RawPeer.frame(type: 1, flags: 0x5, streamID: 3, bomb)
                       + RawPeer.frame(type: 1, flags: 0x5, streamID: 5, RawPeer.getRoot))
        let frames = peer.readFrames { frames in
            frames.contains { $0.type == 3 && $0.streamID == 3 } && frames.contains { $0.type == 1 && $0.streamID == 5 }
        }
        #expect(frames.contains { $0.type == 3 && $0.streamID == 3 }, "stream 3 reset")
        #expect(!frames.contains { $0.type == 1 && $0.streamID == 3 }, "stream 3 not answered")
        #expect(frames.contains { $0.type == 1 && $0.streamID == 1 }, "stream 1 answered")
        #expect(frames.contains { $0.type == 1 && $0.streamID == 5 }, "stream 5 answered after the bomb")
        #expect(refused.load(ordering: .relaxed) == 1)
        // The limit is announced in the server's SETTINGS (MAX_HEADER_LIST_SIZE, 0x6).
        let settings = try #require(frames.first { $0.type == 4 && $0.flags & 1 == 0 })
        let entries = stride(from: 0, to: settings.payload.count, by: 6).map { Array(settings.payload[$0..<($0 + 6)]) }
        let announced = entries.first { $0[0] == 0 && $0[1] == 6 }.map { Int($0[2]) << 24 | Int($0[3]) << 16 | Int($0[4]) << 8 | Int($0[5]) }
        #expect(announced == 16 << 10)
    }

    /// A head over 16 KiB is answered 431 over HTTP/1.1 (heads of 17–24 KB used to pass).
    @Test func anHTTP1HeadOverTheLimitIsAnswered431() throws {
        let refusals = BlockingLock<[String]>([])
        let server = try Self.server(observer: HTTPServerObserver(refusedRequest: { status, reason in
            refusals.withLock { $0.append("\(status) \(reason)") }
        }))
        defer { server.stop() }
        let peer = try RawPeer(port: server.port)
        try peer.write("GET / HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer " + String(repeating: "t", count: 20 << 10) + "\r\n\r\n")
        var answer: [UInt8] = []
        while let bytes = peer.read(), !bytes.isEmpty { answer += bytes }
        let text = String(decoding: answer, as: UTF8.self)
        #expect(text.hasPrefix("HTTP/1.1 431 "), "\(text.prefix(200))")
        #expect(text.contains(#""status":"header_too_large""#) && text.contains(#""message":"#))
        #expect(refusals.withLock { $0 } == ["431 header_too_large"])
    }

    /// Two `Authorization` fields over HTTP/2 are refused as over HTTP/1.1: no protocol picks
    /// one of them.
    @Test func repeatedSingletonFieldsAreRefusedOverHTTP2() throws {
        let server = try Self.server()
        defer { server.stop() }
        let peer = try RawPeer(port: server.port)
        // authorization is static index 23: a literal without indexing, twice.
        let authorization: (String) -> [UInt8] = { value in [0x0F, 0x08, UInt8(value.utf8.count)] + Array(value.utf8) }
        try peer.write(RawPeer.h2cOpening
                       + RawPeer.frame(type: 1, flags: 0x5, streamID: 1, RawPeer.getRoot + authorization("a") + authorization("b"))
                       + RawPeer.frame(type: 1, flags: 0x5, streamID: 3, RawPeer.getRoot + authorization("a")))
        let frames = peer.readFrames { frames in [1, 3].allSatisfy { id in frames.contains { $0.type == 1 && $0.streamID == id } } }
        // HPACK's static table: ":status 400" is index 12, ":status 200" index 8.
        #expect(frames.first { $0.type == 1 && $0.streamID == 1 }?.payload.first == 0x8C, "stream 1 answered 400")
        #expect(frames.first { $0.type == 1 && $0.streamID == 3 }?.payload.first == 0x88, "stream 3 answered 200")
    }

    /// A GOAWAY names the last stream processed, answered or not (it named 0 once the
    /// answered streams had closed, telling the client none was).
    @Test func aGoAwayNamesTheLastStreamProcessed() throws {
        let server = try Self.server()
        defer { server.stop() }
        let peer = try RawPeer(port: server.port)
        try peer.write(RawPeer.h2cOpening + [1, 3, 5].flatMap { RawPeer.frame(type: 1, flags: 0x5, streamID: $0, RawPeer.getRoot) })
        _ = peer.readFrames { frames in [1, 3, 5].allSatisfy { id in frames.contains { $0.type == 1 && $0.streamID == UInt32(id) } } }
        server.drain()
        let frames = peer.readFrames { frames in frames.contains { $0.type == 7 } }
        let goAway = try #require(frames.first { $0.type == 7 })
        let last = UInt32(goAway.payload[0] & 0x7F) << 24 | UInt32(goAway.payload[1]) << 16 | UInt32(goAway.payload[2]) << 8 | UInt32(goAway.payload[3])
        #expect(last == 5)
    }

    /// PINGs are not requests: a connection that only pings is closed once idle.
    @Test func pingsDoNotKeepAnIdleConnectionOpen() throws {
        let timedOut = BlockingLock<[String]>([])
        let server = try Self.server(limits: HTTPServerLimits(idleTimeout: .milliseconds(600)),
                                     observer: HTTPServerObserver(timedOut: { what in timedOut.withLock { $0.append(what) } }))
        defer { server.stop() }
        let peer = try RawPeer(port: server.port, receiveTimeout: 1)
        try peer.write(RawPeer.h2cOpening)
        let started = ContinuousClock.now
        var closed = false
        // A PING every 300 ms (twice per idle period), for up to 5 s.
        while !closed && ContinuousClock.now - started < .seconds(5) {
            guard (try? peer.write(RawPeer.frame(type: 6, [0, 0, 0, 0, 0, 0, 0, 1]))) != nil else { closed = true; break }
            let frames = peer.readFrames { frames in frames.contains { $0.type == 7 } || frames.contains { $0.type == 6 && $0.flags & 1 == 1 } }
            if frames.contains(where: { $0.type == 7 }) || frames.isEmpty { closed = true }
            Thread.sleep(forTimeInterval: 0.3)
        }
        #expect(closed, "a connection sending only PINGs was never closed")
        #expect(timedOut.withLock { $0 }.contains("idle"))
    }

    /// At its connection limit the server says so to its observer (the ingress counts and
    /// logs it) instead of closing connections unseen.
    @Test func aConnectionPastTheLimitIsReported() throws {
        let refused = BlockingLock<[String]>([])
        let server = try Self.server(observer: HTTPServerObserver(refusedConnection: { reason in refused.withLock { $0.append(reason) } }),
                                     maximumConnections: 1)
        defer { server.stop() }
        let first = try RawPeer(port: server.port)
        try first.write("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        #expect(first.read().map { String(decoding: $0, as: UTF8.self).hasPrefix("HTTP/1.1 200") } == true)
        #expect(server.isFull)
        let second = try RawPeer(port: server.port)
        #expect(second.read() == [], "closed at once")
        #expect(refused.withLock { $0 } == ["full"])
    }
}

/// Connections are served on the process's event loops: the thread count stays fixed
/// however many devices connect, each connection costs one descriptor, and each is still
/// answered.
@Suite struct EventLoopServingTests {
    /// Pipes this process holds open (a connection on a thread of its own had a wake pipe).
    private static var pipeCount: Int {
        let descriptors = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
        return descriptors.filter { ((try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\($0)")) ?? "").hasPrefix("pipe:") }.count
    }

    @Test func manyIdleConnectionsTakeNoThreadEachAndAreAllServed() throws {
        let server = try HTTPServer(host: "127.0.0.1", port: 0, tls: nil, name: "many", maximumConnections: 4096) { _ in
            .respond(HTTPServerResponse(status: 200, headers: [], body: Array("ok".utf8)))
        }
        server.start()
        defer { server.stop() }
        // The loops exist once a first connection was served.
        let first = try RawPeer(port: server.port)
        try first.write("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        _ = first.read()
        let pipesBefore = Self.pipeCount
        let count = 500
        let peers = try (0..<count).map { _ in try RawPeer(port: server.port) }
        // Every one of them is served (so every one is open on the server side).
        for peer in peers { try peer.write("GET / HTTP/1.1\r\nHost: a\r\n\r\n") }
        for peer in peers { #expect(peer.read().map { String(decoding: $0, as: UTF8.self).hasPrefix("HTTP/1.1 200") } == true) }
        #expect(server.openCount == count + 1)
        // Served on the loops (a fixed set of threads), not on a thread each.
        #expect(EventLoopGroup.shared.streamCount >= count + 1)
        // No wake pipe per connection: one descriptor each, its socket (other tests open a few pipes meanwhile).
        let pipes = Self.pipeCount - pipesBefore
        #expect(pipes < count / 4, "\(pipes) more pipes for \(count) connections")
    }

    @Test func aHeapGivesItsItemsInOrder() {
        var heap = Heap<Int>()
        var generator = SystemRandomNumberGenerator()
        let items = (0..<500).map { _ in Int.random(in: 0..<1000, using: &generator) }
        for item in items { heap.insert(item) }
        var taken: [Int] = []
        while let item = heap.removeFirst() { taken.append(item) }
        #expect(taken == items.sorted())
    }
}

extension Array where Element == UInt8 {
    /// How many times `needle` occurs (not overlapping).
    func occurrences(of needle: [UInt8]) -> Int {
        guard !needle.isEmpty, count >= needle.count else { return 0 }
        var found = 0
        var index = 0
        while index <= count - needle.count {
            if self[index] == needle[0] && self[index..<(index + needle.count)].elementsEqual(needle) {
                found += 1
                index += needle.count
            } else {
                index += 1
            }
        }
        return found
    }
}
