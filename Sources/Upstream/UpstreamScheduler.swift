import Foundation
import Runtime

/// How the upstream pipeline batches, parallelises and retries.
public struct PipelineSettings: Sendable {
    /// Independent lanes; a device's messages always take the same lane, so they are
    /// handled in arrival order while different devices proceed in parallel.
    public var partitions = 4
    /// Messages waiting per lane before submitters (the connections) wait.
    public var queueCapacity = 2048
    /// Most messages committed in one transaction.
    public var batchSize = 1000
    /// How long a lane holding fewer than `lingerBelow` messages waits for more before it
    /// commits them: at moderate load this turns many tiny transactions (each costing
    /// PostgreSQL a commit and two round trips) into fewer larger ones. Zero commits at once.
    public var batchLinger: Duration = .milliseconds(2)
    /// The batch size from which a lane commits without lingering.
    public var lingerBelow = 64
    /// Handling attempts before a failing message is dead-lettered.
    public var maxAttempts = 5
    /// First retry delay of a failing message (doubling, × [0.5, 1.0], up to `retryCap`).
    public var retryBase: Duration = .seconds(1)
    public var retryCap: Duration = .seconds(60)
    /// First wait while the database is unreachable (doubling up to `databaseRetryCap`).
    public var databaseRetryBase: Duration = .milliseconds(250)
    public var databaseRetryCap: Duration = .seconds(10)

    public init() {}
}

/// The upstream pipeline's decisions, without I/O: which lane a message takes, when a
/// lane lingers for a fuller batch, what becomes of a message whose handling failed, and
/// when a failed one is tried again.
package struct UpstreamScheduler: Sendable {
    let settings: PipelineSettings

    var laneCount: Int { max(1, settings.partitions) }

    /// The lane of a device's messages: the same for every run (FNV-1a of the key).
    func lane(for key: String) -> Int {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in key.utf8 {
            hash ^= UInt64(byte)
            hash = hash &* 0x100_0000_01b3
        }
        return Int(hash % UInt64(laneCount))
    }

    /// How long a lane that took `count` messages waits for more before committing (nil:
    /// commit now). A closing lane never waits.
    func linger(afterTaking count: Int, closing: Bool) -> Duration? {
        guard count > 0, (count < settings.lingerBelow), (settings.batchLinger > .zero), !closing else { return nil }
        return settings.batchLinger
    }

    /// The waits between failed handling attempts of one message.
    var retryBackoff: Backoff { Backoff(base: settings.retryBase, cap: settings.retryCap, jitter: .scaledClosed(0.5...1.0)) }

    /// The waits while the database is unreachable.
    var outageBackoff: Backoff { .outage(base: settings.databaseRetryBase, cap: settings.databaseRetryCap) }

    /// What becomes of a message whose handling failed.
    enum Failure {
        /// Try it again alone at `work.retryAt` (its attempts counted).
        case retry(UpstreamWork, after: Duration)
        /// It failed `maxAttempts` times, or can never succeed: store it as this dead letter.
        case deadLetter(UpstreamWork)
        /// A dead letter that could not be stored: try storing it again later.
        case retryDeadLetter(UpstreamWork, after: Duration)
    }

    /// The decision for `work` after its handling threw `error` (described as
    /// `description`, thrown by `handler` with reason `code`, when known). `permanent`
    /// failures are dead-lettered at once.
    func failure<G: RandomNumberGenerator>(of work: UpstreamWork, description: String, permanent: Bool, handler: String? = nil,
                                           code: String? = nil, now: ContinuousClock.Instant, using generator: inout G) -> Failure {
        var work = work
        work.attempts += 1
        guard case .message(let message) = work.kind else {
            work.retryAt = now + settings.retryBase
            return .retryDeadLetter(work, after: settings.retryBase)
        }
        if permanent || work.attempts >= settings.maxAttempts {
            var letter = work
            letter.kind = .deadLetter(.init(messageID: message.messageID, from: message.from, category: message.category,
                                            rawPayload: message.rawPayload, reason: "handler_failed",
                                            error: description, attempts: work.attempts, receivedAt: message.receivedAt,
                                            handler: handler, code: code))
            return .deadLetter(letter)
        }
        let delay = retryBackoff.delay(attempt: work.attempts - 1, using: &generator)
        work.retryAt = now + delay
        return .retry(work, after: delay)
    }

    /// Messages of one lane waiting for their next attempt, in no particular order.
    struct Retries: Sendable {
        private var waiting: [UpstreamWork] = []

        var isEmpty: Bool { waiting.isEmpty }
        var count: Int { waiting.count }

        mutating func schedule(_ work: UpstreamWork) { waiting.append(work) }

        /// When the next one falls due.
        var next: ContinuousClock.Instant? { waiting.compactMap(\.retryAt).min() }

        /// Takes up to `maximum` that are due at `now`, oldest scheduling first.
        mutating func takeDue(at now: ContinuousClock.Instant, maximum: Int) -> [UpstreamWork] {
            var due: [UpstreamWork] = []
            waiting.removeAll { work in
                guard due.count < maximum, let at = work.retryAt, at <= now else { return false }
                due.append(work)
                return true
            }
            return due
        }

        /// Takes every one, due or not (shutdown).
        mutating func takeAll() -> [UpstreamWork] {
            defer { waiting.removeAll() }
            return waiting
        }
    }
}
