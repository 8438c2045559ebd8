import Foundation
import Runtime
import Simulator
import Synchronization
import Transport
#if canImport(Glibc)
import Glibc
#endif

/// An HTTPS server on loopback for client tests: each connection is an
/// `HTTPServerConnection` (HTTP/2 when `offersHTTP2`, else HTTP/1.1) answering with
/// `handler`; it counts connections and requests.
final class TestHTTPServer: Sendable {
    let authority: CertificateAuthority
    let port: Int
    /// The listening socket until `stop()`; the accept thread holds it while it runs, so it
    /// never accepts on a number the process has given to another socket since.
    private let listener: BlockingLock<OwnedSocket?>
    private let stopped = AtomicFlag(false)
    private let counts = BlockingLock((connections: 0, requests: [HTTPServerRequest]()))

    init(offersHTTP2: Bool = true, maximumConcurrentStreams: UInt32 = 100,
         handler: @escaping @Sendable (HTTPServerRequest, Int) -> HTTPServerAction) throws {
        authority = try CertificateAuthority()
        let context = try TLSContext.server(identity: try authority.issueServerIdentity(), offersHTTP2: offersHTTP2)
        let bound = try TCPListener.open(host: "127.0.0.1", port: 0, nonBlocking: false)
        let socket = OwnedSocket(bound.fd)
        (listener, port) = (BlockingLock(socket), bound.port)
        let (counts, stopped) = (counts, stopped)
        let thread = Thread {
            while !stopped.value {
                let accepted = accept(socket.fd, nil, nil)
                guard accepted >= 0 else { if errno == EINTR { continue }; return }
                let connection = counts.withLock { counts -> Int in
                    counts.connections += 1
                    return counts.connections
                }
                HTTPServerConnection.serve(fd: accepted, context: context, name: "test http server",
                                           maximumConcurrentStreams: maximumConcurrentStreams) { request in
                    let number = counts.withLock { counts -> Int in
                        counts.requests.append(request)
                        return counts.requests.count
                    }
                    _ = connection
                    return handler(request, number)
                }
            }
        }
        thread.start()
    }

    /// Stops accepting; the listening socket closes once the accept thread has ended.
    func stop() {
        stopped.value = true
        listener.withLock { listener in
            defer { listener = nil }
            return listener
        }?.shutDown()
    }

    var connections: Int { counts.withLock { $0.connections } }
    var requests: [HTTPServerRequest] { counts.withLock { $0.requests } }

    var trust: TLSTrust { .caPEM(authority.rootCertificatePEM) }

    static func ok(_ text: String, after delay: Duration = .zero,
                   then: HTTPServerAction.Afterwards = .keepOpen) -> HTTPServerAction {
        .respond(HTTPServerResponse(status: 200, headers: [("content-type", "text/plain")], body: Array(text.utf8)), after: delay, then: then)
    }
}
