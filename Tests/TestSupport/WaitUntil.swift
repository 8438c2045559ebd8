/// A wait that ended before its condition held.
public struct TimedOut: Error, CustomStringConvertible {
    public let description: String
}

/// Waits until `condition` holds, checking it every `interval`; throws `TimedOut` (naming
/// `what`, and `detail` when given) once `limit` has passed. The one way tests wait for
/// something to happen: never a fixed sleep before an assertion.
public func waitUntil(_ what: String, within limit: Duration = .seconds(10), every interval: Duration = .milliseconds(10),
                      detail: @autoclosure () -> String = "", _ condition: () async throws -> Bool) async throws {
    let deadline = ContinuousClock.now + limit
    while try await !condition() {
        guard ContinuousClock.now < deadline else {
            let more = detail()
            throw TimedOut(description: "timed out after \(limit) waiting until \(what)" + (more.isEmpty ? "" : "; \(more)"))
        }
        try await Task.sleep(for: interval)
    }
}
