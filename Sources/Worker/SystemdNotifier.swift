import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Tells systemd how the service is doing (`sd_notify`), when it runs the worker with
/// `Type=notify`: `READY=1` once it serves, `WATCHDOG=1` while it makes progress,
/// `STOPPING=1` when it shuts down, and a `STATUS=` line. Without `NOTIFY_SOCKET` (not
/// under systemd) it does nothing.
struct SystemdNotifier: Sendable {
    private let socketPath: String?
    /// Half of `WATCHDOG_USEC`, when systemd expects pings.
    let watchdogInterval: Duration?

    init(environment: [String: String] = ProcessInfo.processInfo.environment) {
        socketPath = environment["NOTIFY_SOCKET"].flatMap { $0.isEmpty ? nil : $0 }
        if let text = environment["WATCHDOG_USEC"], let microseconds = Int64(text), microseconds > 0,
           environment["WATCHDOG_PID"].map({ $0 == String(getpid()) }) ?? true {
            watchdogInterval = .microseconds(microseconds / 2)
        } else {
            watchdogInterval = nil
        }
    }

    var isActive: Bool { socketPath != nil }

    /// Sends `state` (`READY=1`, `STATUS=…`, several separated by line breaks); returns
    /// whether systemd's socket took it.
    @discardableResult
    func notify(_ state: String) -> Bool {
        guard var path = socketPath else { return false }
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        // An abstract socket is written with a leading @ and sent with a leading NUL.
        let abstract = path.hasPrefix("@")
        if abstract { path.removeFirst() }
        let bytes = Array(path.utf8)
        let capacity = MemoryLayout.size(ofValue: address.sun_path)
        guard bytes.count + (abstract ? 1 : 0) < capacity else { return false }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: (abstract ? [0] : []) + bytes)
        }
        let length = socklen_t(MemoryLayout<sa_family_t>.size + bytes.count + (abstract ? 1 : 0))
        let message = Array(state.utf8)
        let sent = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { socketAddress in
                message.withUnsafeBytes { sendto(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL), socketAddress, length) }
            }
        }
        return sent == message.count
    }
}
