import Foundation
import Runtime
import Synchronization
import Transport
#if canImport(Glibc)
import Glibc
#endif

/// A small HTTP/1.1 server for operators' tools: `GET /metrics` (Prometheus text),
/// `/healthz` and `/readyz` (200 or 503 with a one-line reason). One thread serves every
/// connection at once with `poll`: a request is answered as soon as it has arrived,
/// whatever other clients do, and each connection has `requestDeadline` from its accept to
/// send its request and take its answer, then it is closed. At most `maximumConnections`
/// are kept; beyond that the oldest is dropped for the new one, so idle or slow clients
/// can never delay a probe by more than its own request (one connection at a time, 2 s each,
/// let 18 idle ones time out a `curl -m 3` probe). It never touches the database or the
/// connections: it reads what the worker keeps (`WorkerMetrics`, `Health`).
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

    /// One client connection: what it sent so far, what is left to send it, and when it
    /// must be done.
    private struct Client {
        let fd: Int32
        let deadline: ContinuousClock.Instant
        var request: [UInt8] = []
        var response: [UInt8] = []
        var sent = 0
        var answered: Bool { !response.isEmpty }
    }

    let port: Int
    /// How long a connection has, from its accept, to send its request and take its answer.
    let requestDeadline: Duration
    /// Connections kept at once; the oldest goes when a new one would pass it.
    let maximumConnections: Int
    private let fd: Int32
    /// Wakes the serving thread to stop.
    private let wake: WakePipe
    private let routes: Routes
    private let stopped = Atomic(false)
    /// The longest request head read.
    private static let maximumRequest = 8192

    /// Listens on `address` (`host:port`, `[v6]:port`).
    /// - Throws: `ConfigurationError` when it cannot listen there.
    init(address: String, routes: Routes, requestDeadline: Duration = .seconds(2), maximumConnections: Int = 256) throws(ConfigurationError) {
        var host = address, portText = ""
        if let colon = address.lastIndex(of: ":") {
            host = String(address[..<colon])
            portText = String(address[address.index(after: colon)...])
        }
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        guard let port = Int(portText) else { throw ConfigurationError("invalid metrics address \(address): expected host:port") }
        do { self.wake = try WakePipe() } catch { throw ConfigurationError("cannot serve metrics: \(error)") }
        do {
            let listener = try TCPListener.open(host: host.isEmpty ? "0.0.0.0" : host, port: port, nonBlocking: true, backlog: 64)
            self.fd = listener.fd
            self.port = listener.port
        } catch {
            throw ConfigurationError("cannot serve metrics: \(error)")
        }
        self.routes = routes
        self.requestDeadline = requestDeadline
        self.maximumConnections = max(1, maximumConnections)
        let thread = Thread { [self] in serveLoop() }
        thread.name = "fcm-worker metrics"
        thread.start()
    }

    /// Stops serving: the thread closes every connection and ends.
    func stop() {
        guard !stopped.exchange(true, ordering: .acquiringAndReleasing) else { return }
        wake.wake()
    }

    private func serveLoop() {
        var clients: [Client] = []
        defer {
            for client in clients { close(client.fd) }
            close(fd)
        }
        while !stopped.load(ordering: .acquiring) {
            let now = ContinuousClock.now
            // Past their deadline: closed, answered or not.
            clients.removeAll { client in
                guard client.deadline <= now else { return false }
                close(client.fd)
                return true
            }
            var polled = [wake.pollDescriptor, pollfd(fd: fd, events: Int16(POLLIN), revents: 0)]
            for client in clients {
                polled.append(pollfd(fd: client.fd, events: Int16(client.answered ? POLLOUT : POLLIN), revents: 0))
            }
            let wait = clients.map(\.deadline).min().map { max(.zero, $0 - now) } ?? .seconds(60)
            let timeout = max(1, wait.pollMilliseconds)
            let ready = poll(&polled, nfds_t(polled.count), timeout)
            if ready < 0 {
                if errno == EINTR { continue }
                return
            }
            if polled[0].revents != 0 { return }
            // Clients first (their indices match), then new connections.
            var index = clients.count - 1
            while index >= 0 {
                let events = polled[index + 2].revents
                if events != 0, !serve(&clients[index], events: events) {
                    close(clients[index].fd)
                    clients.remove(at: index)
                }
                index -= 1
            }
            if polled[1].revents & Int16(POLLIN) != 0 { accept(into: &clients) }
        }
    }

    /// Takes every pending connection, dropping the oldest kept one for each beyond the
    /// maximum.
    private func accept(into clients: inout [Client]) {
        while true {
            let client = Glibc.accept(fd, nil, nil)
            if client < 0 {
                if errno == EINTR || errno == ECONNABORTED { continue }
                return
            }
            _ = fcntl(client, F_SETFD, FD_CLOEXEC)
            _ = fcntl(client, F_SETFL, fcntl(client, F_GETFL) | O_NONBLOCK)
            if clients.count >= maximumConnections {
                close(clients[0].fd)
                clients.removeFirst()
            }
            clients.append(Client(fd: client, deadline: .now + requestDeadline))
        }
    }

    /// Reads what `client` sent (answering once its request head is complete) or sends it
    /// what is left of its answer. False when it is done with (answered, gone, or bad).
    private func serve(_ client: inout Client, events: Int16) -> Bool {
        if client.answered {
            return send(&client)
        }
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = buffer.withUnsafeMutableBytes { recv(client.fd, $0.baseAddress, $0.count, 0) }
            if count < 0 {
                if errno == EINTR { continue }
                return errno == EAGAIN || errno == EWOULDBLOCK
            }
            guard count > 0 else { return false }
            client.request += buffer[..<count]
            if client.request.firstRange(of: [13, 10, 13, 10]) != nil || client.request.count >= Self.maximumRequest {
                client.response = answer(client.request)
                return send(&client)
            }
        }
    }

    /// Sends what is left of the answer; false once it is all sent (or the client is gone).
    private func send(_ client: inout Client) -> Bool {
        while client.sent < client.response.count {
            let written = client.response[client.sent...].withUnsafeBytes { Glibc.send(client.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if written < 0 {
                if errno == EINTR { continue }
                return errno == EAGAIN || errno == EWOULDBLOCK
            }
            client.sent += written
        }
        return false
    }

    /// The response to a request head.
    private func answer(_ request: [UInt8]) -> [UInt8] {
        let head = String(decoding: request, as: UTF8.self)
        // ("\r\n" is one Character: split on newlines, not on "\r".)
        let parts = (head.split(whereSeparator: \.isNewline).first ?? "").split(separator: " ")
        guard parts.count == 3, parts[2].hasPrefix("HTTP/1."), request.firstRange(of: [13, 10, 13, 10]) != nil else {
            return Self.response(status: "400 Bad Request", type: "text/plain", body: "bad request\n")
        }
        guard parts[0] == "GET" || parts[0] == "HEAD" else {
            return Self.response(status: "405 Method Not Allowed", type: "text/plain", body: "only GET\n")
        }
        let path = parts[1].split(separator: "?").first.map(String.init) ?? ""
        let headOnly = parts[0] == "HEAD"
        switch path {
        case "/metrics":
            return Self.response(status: "200 OK", type: "text/plain; version=0.0.4; charset=utf-8", body: routes.metrics(), headOnly: headOnly)
        case "/healthz", "/readyz":
            let probe = path == "/healthz" ? routes.health() : routes.readiness()
            return Self.response(status: probe.ok ? "200 OK" : "503 Service Unavailable", type: "text/plain",
                                 body: probe.reason + "\n", headOnly: headOnly)
        default:
            return Self.response(status: "404 Not Found", type: "text/plain", body: "not found: /metrics, /healthz, /readyz\n",
                                 headOnly: headOnly)
        }
    }

    private static func response(status: String, type: String, body: String, headOnly: Bool = false) -> [UInt8] {
        let payload = Array(body.utf8)
        var bytes = Array("HTTP/1.1 \(status)\r\nContent-Type: \(type)\r\nContent-Length: \(payload.count)\r\nConnection: close\r\n\r\n".utf8)
        if !headOnly { bytes += payload }
        return bytes
    }
}
