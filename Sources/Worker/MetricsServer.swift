import Foundation
import Runtime
import Upstream
import Transport

/// The operators' endpoint: `GET /metrics` (Prometheus text), `/healthz` and `/readyz` (200
/// or 503 with a one-line reason), on the same HTTP server as the ingress and the
/// simulators (`HTTPServer`, plain HTTP/1.1 here). Each connection is answered and closed;
/// one that sends nothing, or not its whole request, within `requestDeadline` is closed;
/// at most `maximumConnections` are kept, the oldest dropped for a new one, so idle or
/// slow clients never delay a probe. It never touches the database or the connections: it
/// reads what the worker keeps (`WorkerMetrics`, `Health`).
final class MetricsServer: Sendable {
    /// What a probe answers.
    struct Probe: Sendable {
        let ok: Bool
        let reason: String
    }

    /// The answers, computed on the connection's thread for each request.
    struct Routes: Sendable {
        let metrics: @Sendable () -> String
        let health: @Sendable () -> Probe
        let readiness: @Sendable () -> Probe
    }

    let port: Int
    private let server: HTTPServer

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
        do {
            server = try HTTPServer(host: host.isEmpty ? "0.0.0.0" : host, port: port, tls: nil, name: "fcm-worker metrics",
                                    limits: HTTPServerLimits(maximumBodyBytes: 8192, idleTimeout: requestDeadline, requestTimeout: requestDeadline),
                                    maximumConnections: max(1, maximumConnections), dropsOldestWhenFull: true) { request in
                .respond(Self.answer(request, routes: routes), then: .goAway)
            }
        } catch {
            throw ConfigurationError("cannot serve metrics: \(error)")
        }
        self.port = server.port
        server.start()
    }

    /// Stops serving and closes every connection.
    func stop() {
        server.stop()
    }

    private static func answer(_ request: HTTPServerRequest, routes: Routes) -> HTTPServerResponse {
        guard request.method == "GET" || request.method == "HEAD" else {
            return response(405, type: "text/plain", body: "only GET\n")
        }
        let path = request.path.split(separator: "?").first.map(String.init) ?? ""
        let headOnly = request.method == "HEAD"
        switch path {
        case "/metrics":
            return response(200, type: "text/plain; version=0.0.4; charset=utf-8", body: routes.metrics(), headOnly: headOnly)
        case "/healthz", "/readyz":
            let probe = path == "/healthz" ? routes.health() : routes.readiness()
            return response(probe.ok ? 200 : 503, type: "text/plain", body: probe.reason + "\n", headOnly: headOnly)
        default:
            return response(404, type: "text/plain", body: "not found: /metrics, /healthz, /readyz\n", headOnly: headOnly)
        }
    }

    private static func response(_ status: Int, type: String, body: String, headOnly: Bool = false) -> HTTPServerResponse {
        let payload = Array(body.utf8)
        return HTTPServerResponse(status: status, headers: [("content-type", type)], body: headOnly ? [] : payload)
    }
}
