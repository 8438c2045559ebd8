import Foundation
import Runtime
import Synchronization
import Transport
#if canImport(Glibc)
import Glibc
#endif

/// A small HTTP/1.1 server for operators' tools: `GET /metrics` (Prometheus text),
/// `/healthz` and `/readyz` (200 or 503 with a one-line reason). One thread accepts and
/// answers each request in turn (a scrape takes microseconds); a client that sends nothing
/// for 2 s is dropped. It never touches the database or the connections: it reads what the
/// worker keeps (`WorkerMetrics`, `Health`).
final class MetricsServer: Sendable {
    /// What a probe answers.
    struct Probe: Sendable {
        let ok: Bool
        let reason: String
    }

    /// The answers, computed on the server's thread for each request.
    struct Routes: Sendable {
        let metrics: @Sendable () -> String
        let health: @Sendable () -> Probe
        let readiness: @Sendable () -> Probe
    }

    let port: Int
    private let fd: Int32
    private let routes: Routes
    private let stopped = Atomic(false)

    /// Listens on `address` (`host:port`, `[v6]:port`).
    /// - Throws: `ConfigurationError` when it cannot listen there.
    init(address: String, routes: Routes) throws(ConfigurationError) {
        var host = address, portText = ""
        if let colon = address.lastIndex(of: ":") {
            host = String(address[..<colon])
            portText = String(address[address.index(after: colon)...])
        }
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        guard let port = Int(portText) else { throw ConfigurationError("invalid metrics address \(address): expected host:port") }
        do {
            let listener = try TCPListener.open(host: host.isEmpty ? "0.0.0.0" : host, port: port, nonBlocking: false, backlog: 16)
            self.fd = listener.fd
            self.port = listener.port
        } catch {
            throw ConfigurationError("cannot serve metrics: \(error)")
        }
        self.routes = routes
        let thread = Thread { [self] in acceptLoop() }
        thread.name = "fcm-worker metrics"
        thread.start()
    }

    /// Stops accepting; the thread ends after the request it is answering.
    func stop() {
        guard !stopped.exchange(true, ordering: .acquiringAndReleasing) else { return }
        shutdown(fd, Int32(SHUT_RDWR))
    }

    private func acceptLoop() {
        defer { close(fd) }
        while !stopped.load(ordering: .acquiring) {
            let client = accept(fd, nil, nil)
            if client < 0 {
                if errno == EINTR || errno == ECONNABORTED { continue }
                return
            }
            answer(client)
            close(client)
        }
    }

    private func answer(_ client: Int32) {
        var timeout = timeval(tv_sec: 2, tv_usec: 0)
        setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(client, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var request: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while request.count < 8192 {
            let count = buffer.withUnsafeMutableBytes { recv(client, $0.baseAddress, $0.count, 0) }
            guard count > 0 else { return }
            request += buffer[..<count]
            if request.firstRange(of: [13, 10, 13, 10]) != nil { break }
        }
        let head = String(decoding: request, as: UTF8.self)
        // ("\r\n" is one Character: split on newlines, not on "\r".)
        let parts = (head.split(whereSeparator: \.isNewline).first ?? "").split(separator: " ")
        guard parts.count == 3, parts[2].hasPrefix("HTTP/1.") else {
            return respond(client, status: "400 Bad Request", type: "text/plain", body: "bad request\n")
        }
        guard parts[0] == "GET" || parts[0] == "HEAD" else {
            return respond(client, status: "405 Method Not Allowed", type: "text/plain", body: "only GET\n")
        }
        let path = parts[1].split(separator: "?").first.map(String.init) ?? ""
        let headOnly = parts[0] == "HEAD"
        switch path {
        case "/metrics":
            respond(client, status: "200 OK", type: "text/plain; version=0.0.4; charset=utf-8", body: routes.metrics(), headOnly: headOnly)
        case "/healthz", "/readyz":
            let probe = path == "/healthz" ? routes.health() : routes.readiness()
            respond(client, status: probe.ok ? "200 OK" : "503 Service Unavailable", type: "text/plain",
                    body: probe.reason + "\n", headOnly: headOnly)
        default:
            respond(client, status: "404 Not Found", type: "text/plain", body: "not found: /metrics, /healthz, /readyz\n", headOnly: headOnly)
        }
    }

    private func respond(_ client: Int32, status: String, type: String, body: String, headOnly: Bool = false) {
        let payload = Array(body.utf8)
        var bytes = Array("HTTP/1.1 \(status)\r\nContent-Type: \(type)\r\nContent-Length: \(payload.count)\r\nConnection: close\r\n\r\n".utf8)
        if !headOnly { bytes += payload }
        var offset = 0
        while offset < bytes.count {
            let written = bytes[offset...].withUnsafeBytes { send(client, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard written > 0 else { return }
            offset += written
        }
    }
}
