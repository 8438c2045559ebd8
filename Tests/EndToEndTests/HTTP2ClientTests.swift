import Foundation
import Runtime
import Synchronization
import Testing
import Transport

/// The HTTP/2 client against a real HTTP/2 server (libnghttp2 on both sides, TLS with ALPN):
/// concurrent streams within the server's limit, requests moved after a GOAWAY and never
/// sent twice, reset streams and broken connections reported as unknown outcomes, the
/// HTTP/1.1 fallback, deadlines and cancellation.
@Suite struct HTTP2ClientTests {
    @Test func manyRequestsShareOneConnectionWithinTheServersStreamLimit() async throws {
        let arrivals = BlockingLock([ContinuousClock.Instant]())
        let server = try TestHTTPServer(maximumConcurrentStreams: 50) { request, _ in
            arrivals.withLock { $0.append(.now) }
            return TestHTTPServer.ok("answer to \(request.bodyText)", after: .milliseconds(30))
        }
        defer { server.stop() }
        let client = try HTTP2Client(host: "127.0.0.1", port: server.port, trust: server.trust, maximumConnections: 1,
                                     maximumStreamsPerConnection: 100)
        let answers = try await withThrowingTaskGroup(of: String.self) { group in
            for index in 0..<300 {
                group.addTask {
                    let response = try await client.send(method: "POST", path: "/echo", headers: ["content-type": "text/plain"],
                                                         body: Array("\(index)".utf8))
                    #expect(response.status == 200)
                    return response.body
                }
            }
            return try await group.reduce(into: Set<String>()) { $0.insert($1) }
        }
        #expect(answers == Set((0..<300).map { "answer to \($0)" }))
        #expect(server.connections == 1)
        #expect(server.requests.count == 300)
        #expect(server.requests.allSatisfy { $0.protocolName == "h2" && $0.method == "POST" && $0.path == "/echo" })
        // A stream is open at the server for the 30 ms until its answer, and the client
        // opens the next only after an answer: within any 30 ms, at most the server's limit
        // (50) arrive, and more than one did (they ran concurrently).
        let times = arrivals.withLock { $0 }
        let peak = times.map { time in times.filter { $0 <= time && time - $0 < .milliseconds(30) }.count }.max() ?? 0
        #expect(peak > 1 && peak <= 50, "peak \(peak)")
        #expect(!client.fellBackToHTTP1)
    }

    @Test func aGoAwayMovesTheUnprocessedRequestsToANewConnectionWithoutSendingAnyTwice() async throws {
        // The 5th request is answered with a GOAWAY naming it as the last processed stream:
        // the streams the client opened after it are refused unprocessed and go elsewhere.
        let server = try TestHTTPServer { request, number in
            TestHTTPServer.ok(request.bodyText, after: .milliseconds(20), then: number == 5 ? .goAway : .keepOpen)
        }
        defer { server.stop() }
        let client = try HTTP2Client(host: "127.0.0.1", port: server.port, trust: server.trust, maximumConnections: 1)
        let answers = try await withThrowingTaskGroup(of: String.self) { group in
            for index in 0..<40 {
                group.addTask {
                    try await client.send(method: "POST", path: "/", headers: [:], body: Array("\(index)".utf8)).body
                }
            }
            return try await group.reduce(into: [String]()) { $0.append($1) }
        }
        #expect(Set(answers) == Set((0..<40).map(String.init)) && answers.count == 40)
        // Each request processed once: none was sent again after the server acted on it.
        let processed = server.requests.map(\.bodyText)
        #expect(processed.count == Set(processed).count, "a request was processed twice")
        #expect(Set(processed) == Set((0..<40).map(String.init)))
        #expect(server.connections >= 2)
        #expect(client.outcomeUnknownCount == 0)
    }

    @Test func aResetStreamIsAnUnknownOutcomeAndTheOthersGoOn() async throws {
        let server = try TestHTTPServer { request, _ in
            request.bodyText == "reset me" ? .resetStream : TestHTTPServer.ok("fine")
        }
        defer { server.stop() }
        let client = try HTTP2Client(host: "127.0.0.1", port: server.port, trust: server.trust)
        await #expect(throws: TransportError.self) {
            _ = try await client.send(method: "POST", path: "/", headers: [:], body: Array("reset me".utf8))
        }
        #expect(client.outcomeUnknownCount == 1)
        let next = try await client.send(method: "POST", path: "/", headers: [:], body: Array("next".utf8))
        #expect(next.body == "fine")
        #expect(server.connections == 1, "a reset stream keeps its connection")
    }

    @Test func aConnectionDroppedMidFlightFailsWhatWasSentAsUnknownAndTheNextRequestReconnects() async throws {
        let server = try TestHTTPServer { request, _ in
            request.bodyText == "drop" ? .dropConnection : .hold
        }
        defer { server.stop() }
        let client = try HTTP2Client(host: "127.0.0.1", port: server.port, trust: server.trust, maximumConnections: 1)
        let held = Task { try await client.send(method: "POST", path: "/", headers: [:], body: Array("held".utf8)) }
        while server.requests.isEmpty { try await Task.sleep(for: .milliseconds(5)) }
        await #expect(throws: TransportError.self) {
            _ = try await client.send(method: "POST", path: "/", headers: [:], body: Array("drop".utf8))
        }
        let heldOutcome = await held.result
        guard case .failure(let error) = heldOutcome, let transportError = error as? TransportError else {
            Issue.record("the held request did not fail: \(heldOutcome)")
            return
        }
        #expect(transportError.isOutcomeUnknown)
        #expect(client.outcomeUnknownCount == 2)
    }

    @Test func aServerThatChoosesHTTP1IsServedOverKeepAliveConnections() async throws {
        let server = try TestHTTPServer(offersHTTP2: false) { request, _ in TestHTTPServer.ok("one-one \(request.bodyText)") }
        defer { server.stop() }
        let client = try HTTP2Client(host: "127.0.0.1", port: server.port, trust: server.trust)
        for index in 0..<5 {
            let response = try await client.send(method: "POST", path: "/x", headers: ["content-type": "text/plain"],
                                                 body: Array("\(index)".utf8))
            #expect(response.body == "one-one \(index)")
        }
        #expect(client.fellBackToHTTP1)
        #expect(server.requests.allSatisfy { $0.protocolName == "http/1.1" })
        #expect(server.requests.count == 5, "the request the h2 attempt carried was not sent over it")
    }

    @Test func anUnansweredRequestEndsAtItsDeadlineAndACancelledOneAtOnce() async throws {
        let server = try TestHTTPServer { _, _ in .hold }
        defer { server.stop() }
        let client = try HTTP2Client(host: "127.0.0.1", port: server.port, trust: server.trust, timeout: .milliseconds(300))
        let started = ContinuousClock.now
        do {
            _ = try await client.send(method: "POST", path: "/", headers: [:], body: [1])
            Issue.record("a held request was answered")
        } catch let error as TransportError {
            #expect(error.isOutcomeUnknown, "\(error)")
        }
        #expect(ContinuousClock.now - started < .seconds(5))
        let cancelled = Task { try await client.send(method: "POST", path: "/", headers: [:], body: [2]) }
        while server.requests.count < 2 { try await Task.sleep(for: .milliseconds(5)) }
        cancelled.cancel()
        let outcome = await cancelled.result
        guard case .failure(let error) = outcome else {
            Issue.record("a cancelled request was answered")
            return
        }
        #expect(error as? TransportError == .cancelled)
    }
}
