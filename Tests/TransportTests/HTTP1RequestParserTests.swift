import Testing
@testable import Transport

/// The server's HTTP/1.1 reader frames requests as RFC 9112 says and refuses every framing
/// that a proxy in front could read otherwise (request smuggling), with the status a server
/// answers it with.
@Suite struct HTTP1RequestParserTests {
    /// What the reader makes of `text` given in one read: the requests read, and the refusal
    /// that stopped it.
    private static func read(_ text: String, maximumHeadBytes: Int = 16 << 10, maximumBodyBytes: Int = 1 << 20)
        -> (requests: [HTTP1RequestParser.Request], refusal: HTTP1RequestParser.Refusal?) {
        var parser = HTTP1RequestParser(maximumHeadBytes: maximumHeadBytes, maximumBodyBytes: maximumBodyBytes)
        Array(text.utf8).withUnsafeBytes { parser.append($0) }
        var requests: [HTTP1RequestParser.Request] = []
        do {
            while let request = try parser.next() { requests.append(request) }
        } catch {
            return (requests, error)
        }
        return (requests, nil)
    }

    private static func refusal(_ text: String) -> HTTP1RequestParser.Refusal? { read(text).refusal }

    @Test func aRequestIsReadWithItsFieldsAndBody() throws {
        let (requests, refusal) = Self.read("POST /v1/messages?x=1 HTTP/1.1\r\nHost: a\r\nContent-Type:application/json \r\n"
                                            + "Authorization: Bearer t\r\nContent-Length: 2\r\n\r\n{}")
        #expect(refusal == nil)
        let request = try #require(requests.first)
        #expect(request.method == "POST" && request.target == "/v1/messages?x=1" && request.minorVersion == 1)
        #expect(request.header("content-type") == "application/json")
        #expect(request.header("authorization") == "Bearer t")
        #expect(request.body == Array("{}".utf8))
        #expect(request.keepsAlive)
    }

    @Test func pipelinedRequestsAreReadOneAfterAnother() {
        let text = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\nx" + String(repeating: "GET / HTTP/1.1\r\nHost: a\r\n\r\n", count: 3000)
        let (requests, refusal) = Self.read(text)
        #expect(refusal == nil)
        #expect(requests.count == 3001)
        #expect(requests.dropFirst().allSatisfy { $0.method == "GET" && $0.body.isEmpty })
    }

    @Test func chunkedBodiesAreJoinedAndTheirTrailersDropped() {
        let (requests, refusal) = Self.read("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                                            + "3;name=value\r\nabc\r\nA\r\n0123456789\r\n0\r\nX-Trailer: 1\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n")
        #expect(refusal == nil)
        #expect(requests.count == 2)
        #expect(requests.first?.body == Array("abc0123456789".utf8))
    }

    @Test func aRequestSplitAnywhereIsReadTheSame() throws {
        let text = Array("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n".utf8)
        for cut in 1..<text.count {
            var parser = HTTP1RequestParser()
            text[..<cut].withUnsafeBytes { parser.append($0) }
            var request = try parser.next()
            text[cut...].withUnsafeBytes { parser.append($0) }
            if request == nil { request = try parser.next() }
            #expect(request?.body == Array("hello".utf8), "cut at \(cut)")
        }
    }

    @Test func framingsAProxyCouldReadOtherwiseAreRefused() {
        let cases: [(String, Int)] = [
            // Two lengths: a proxy that takes the first sees a second request in the body.
            ("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 30\r\n\r\nabc", 400),
            ("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 3\r\n\r\nabc", 400),
            ("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
            ("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\nabc", 501),
            ("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n", 501),
            ("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501),
            ("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n", 400),
            ("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
            ("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
            // Whitespace before the colon: some proxies drop the field, some trim the name.
            ("POST / HTTP/1.1\r\nHost: a\r\nContent-Length : 3\r\n\r\nabc", 400),
            ("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\nabc", 400),
            ("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", 400),
            ("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n+3\r\nabc\r\n0\r\n\r\n", 400),
            ("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n 3\r\nabc\r\n0\r\n\r\n", 400),
            ("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY0\r\n\r\n", 400),
            ("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1234567890abcdef0\r\n", 400),
            // Obsolete line folding, bare CR and LF, NUL.
            ("GET / HTTP/1.1\r\nHost: a\r\nX-A: b\r\n c\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nHost: a\r\nX-A: b\rc\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nHost: a\nX-A: b\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nHost: a\r\nX-A: b\u{0}c\r\n\r\n", 400),
            // No Host, two Hosts, a garbage version, a start line of other shape.
            ("GET / HTTP/1.1\r\nX-A: b\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
            ("GET / HTTP/1.1x\r\nHost: a\r\n\r\n", 400),
            ("GET / FOO/1.1\r\nHost: a\r\n\r\n", 400),
            ("GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505),
            ("GET  / HTTP/1.1\r\nHost: a\r\n\r\n", 400),
            ("GET /\r\nHost: a\r\n\r\n", 400),
            ("G(T / HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        ]
        for (text, status) in cases {
            let refusal = Self.refusal(text)
            #expect(refusal?.status == status, "\(text.debugDescription): \(String(describing: refusal))")
        }
    }

    @Test func singletonFieldsGivenTwiceAreRefused() {
        for name in ["Authorization", "X-Firebase-AppCheck", "Content-Type", "Host", "Content-Length"] {
            let value = name == "Content-Length" ? "0" : "x"
            let text = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\(name): \(value)\r\n" + (name == "Host" || name == "Content-Length" ? "" : "\(name): \(value)\r\n") + "\r\n"
            #expect(Self.refusal(text)?.status == 400, "\(name)")
        }
        #expect(HTTPServerRequest.repeatedSingleton(in: [("authorization", "a"), ("x", "1"), ("authorization", "b")]) == "authorization")
        #expect(HTTPServerRequest.repeatedSingleton(in: [("authorization", "a"), ("x-firebase-appcheck", "b"), ("accept", "1"), ("accept", "2")]) == nil)
    }

    @Test func theHeadLimitCountsEveryByteAndIsAnswered431() {
        let field = "X-Pad: " + String(repeating: "p", count: 17 << 10) + "\r\n"
        // Whole in one read, and with its end not here yet.
        #expect(Self.refusal("GET / HTTP/1.1\r\nHost: a\r\n" + field + "\r\n")?.status == 431)
        #expect(Self.refusal("GET / HTTP/1.1\r\nHost: a\r\n" + field)?.status == 431)
        #expect(Self.refusal("GET / HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer " + String(repeating: "t", count: 20 << 10) + "\r\n\r\n")?.status == 431)
        // Just under it: read.
        let under = "GET / HTTP/1.1\r\nHost: a\r\nX-Pad: " + String(repeating: "p", count: (16 << 10) - 64) + "\r\n\r\n"
        #expect(Self.read(under).requests.count == 1)
        // Trailers count too.
        #expect(Self.refusal("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n" + field + "\r\n")?.status == 431)
    }

    @Test func bodiesOverTheLimitAreRefused413() {
        #expect(Self.read("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\n", maximumBodyBytes: 10).refusal?.status == 413)
        #expect(Self.read("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nabcdef\r\n6\r\n", maximumBodyBytes: 10)
            .refusal?.status == 413)
    }

    @Test func aValueThatIsNotUTF8IsRefused() {
        var bytes = Array("GET / HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer ".utf8)
        bytes += [0xFF, 0xFE]
        bytes += Array("\r\n\r\n".utf8)
        var parser = HTTP1RequestParser()
        bytes.withUnsafeBytes { parser.append($0) }
        #expect(throws: HTTP1RequestParser.Refusal.self) { try parser.next() }
    }

    @Test func connectionOptionsDecideWhetherItStaysOpen() {
        #expect(Self.read("GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").requests.first?.keepsAlive == false)
        #expect(Self.read("GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, close\r\n\r\n").requests.first?.keepsAlive == false)
        #expect(Self.read("GET / HTTP/1.0\r\n\r\n").requests.first?.keepsAlive == false)
        #expect(Self.read("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").requests.first?.keepsAlive == true)
    }

    @Test func aHeadThatExpects100ContinueAsksOnce() throws {
        var parser = HTTP1RequestParser()
        Array("POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n".utf8).withUnsafeBytes { parser.append($0) }
        #expect(try parser.next() == nil)
        do { let asked = parser.takeContinueRequest(); #expect(asked) }
        do { let asked = parser.takeContinueRequest(); #expect(!asked) }
        Array("abcd".utf8).withUnsafeBytes { parser.append($0) }
        #expect(try parser.next()?.body == Array("abcd".utf8))
    }
}
