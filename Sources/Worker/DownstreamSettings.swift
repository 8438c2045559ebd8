import FCM
import Foundation
import Runtime

/// How the outbox is sent: the claim lease, the sweep, and the retry policy.
public struct DownstreamSettings: Sendable {
    /// How long a claim on a row lasts without renewal; another worker takes the row over
    /// after that (the claiming worker renews its rows every third of it).
    public var lease: Duration = .seconds(60)
    /// How often the outbox is checked when no NOTIFY arrives (catches anything missed).
    public var sweepInterval: Duration = .seconds(1)
    /// Retries after `SERVICE_UNAVAILABLE`, `INTERNAL_SERVER_ERROR` and rate limits.
    public var retry = DownstreamRetryPolicy()
    /// Written to `claimed_by`; unique per process by default.
    public var workerID = DownstreamSettings.defaultWorkerID()
    /// A message CCS has not answered this long after it was sent is presumed lost (its
    /// answer went missing, or a stanza error named no stanza): its slot is freed and it
    /// is sent again (at-least-once).
    public var answerTimeout: Duration = .seconds(60)
    /// Rows claimed ahead of the free window slots, per connection. Claims wait until half
    /// of it (at most a window, 100 rows) is wanted: fewer, larger claim transactions.
    public var readAheadPerConnection = 200

    public init() {}

    /// `host:pid:random`.
    public static func defaultWorkerID() -> String {
        "\(ProcessInfo.processInfo.hostName):\(ProcessInfo.processInfo.processIdentifier):\(UInt32.random(in: 0...UInt32.max))"
    }
}
