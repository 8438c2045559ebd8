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
    /// of it (at most three windows, 300 rows) is wanted: fewer, larger claim transactions.
    /// A claim's fixed cost to PostgreSQL is that of many rows, so at one connection this
    /// decides much of what a message costs it (600 against 200: 2.6-3.1 against 2.9-4.0
    /// times a stored upstream message, `bench downstream --runs 1@20`, paired). Each
    /// claimed row waits in memory until sent, and other workers cannot take it meanwhile.
    public var readAheadPerConnection = 600
    /// The first pause of v1 sending after FCM refused the project's quota (`QUOTA_EXCEEDED`
    /// without `Retry-After`, or with a shorter one): Google asks for at least a minute. It
    /// doubles with each pause that follows another (to 5 minutes), and a topic's own quota
    /// holds its rows as long.
    public var v1QuotaPause: Duration = .seconds(60)
    /// FCM's quota window (a minute): after a pause, v1 sending resumes at the rate FCM
    /// accepted over it, 25 % faster with each window that passes without another refusal.
    public var v1QuotaWindow: Duration = .seconds(60)
    /// How often rows no claim would see (pending at or below the claim frontier: an id taken
    /// before its transaction wrote) are looked for, and how old one must be to count
    /// (younger ones may still be read by a claim through its gaps).
    public var strandedRowSweep: Duration = .seconds(60)
    public var strandedRowAge: Duration = .seconds(120)

    public init() {}

    /// `host:pid:random`.
    public static func defaultWorkerID() -> String {
        "\(ProcessInfo.processInfo.hostName):\(ProcessInfo.processInfo.processIdentifier):\(UInt32.random(in: 0...UInt32.max))"
    }
}
