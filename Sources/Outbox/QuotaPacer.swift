import Foundation
import Runtime

/// How v1 sending behaves around FCM's project quota (`QUOTA_EXCEEDED` for the project):
/// a pause of exponential length (from `initialPause`, doubling with each pause that follows
/// another within a quota window, with up to a quarter more at random, `Retry-After` when
/// longer, at most `maximumPause`), then sending resumes **paced** instead of releasing the
/// whole queue at once: at the rate FCM accepted over the quota window before the pause,
/// 25 % faster for each window that passes without another, unpaced again once four
/// times the first rate. FCM's quota counts messages per minute (not aligned to the
/// clock), so the window is a minute.
///
/// A pure value: the transport tells it of each accepted message (`accepted`) and each
/// project quota refusal (`pause`), and asks it before each request (`admit`).
package struct QuotaPacer: Sendable {
    package let initialPause: Duration
    package let maximumPause: Duration
    /// FCM's quota window.
    package let window: Duration

    /// Messages FCM counted over the window, for the rate before a pause.
    private var counted: CountWindow
    /// Until when nothing is sent (nil: no pause).
    package private(set) var pausedUntil: ContinuousClock.Instant?
    /// Pauses in a row (each within a window of the one before).
    private var consecutivePauses = 0
    private var lastPause: ContinuousClock.Instant?
    /// The paced rate, messages per second (nil: unpaced), its first value, and when it last grew.
    package private(set) var rate: Double?
    private var firstRate = 0.0
    private var rateGrewAt: ContinuousClock.Instant
    /// Requests the pacing admits now (at most a tenth of a second's worth saved up, at least one).
    private var allowance = 0.0
    private var refilledAt: ContinuousClock.Instant

    package init(initialPause: Duration = .seconds(60), maximumPause: Duration = .seconds(300), window: Duration = .seconds(60),
                 now: ContinuousClock.Instant = .now) {
        self.initialPause = initialPause
        self.maximumPause = maximumPause
        self.window = window
        counted = CountWindow(window: window, now: now)
        rateGrewAt = now
        refilledAt = now
    }

    /// FCM counted a message (accepted, or refused for anything but the quota).
    package mutating func accepted(at now: ContinuousClock.Instant) {
        counted.add(at: now)
    }

    /// FCM refused a send for the project's quota: returns how long sending pauses (nil when
    /// a pause already covers it). `retryAfter` lengthens it; `random` in 0...1 its jitter.
    package mutating func pause(retryAfter: Duration?, at now: ContinuousClock.Instant, random: Double) -> Duration? {
        if let pausedUntil, pausedUntil > now { return nil }
        if let lastPause, now - lastPause <= window + maximumPause {
            consecutivePauses += 1
        } else {
            consecutivePauses = 0
        }
        lastPause = now
        let doubled = initialPause * Double(1 << min(consecutivePauses, 16))
        let backoff = min(maximumPause, doubled + doubled * (0.25 * random))
        let wait = max(backoff, min(retryAfter ?? .zero, maximumPause))
        pausedUntil = now + wait
        let acceptedInWindow = counted.total(at: now)
        firstRate = max(1, Double(acceptedInWindow) / window.seconds)
        rate = min(rate ?? firstRate, firstRate)
        rateGrewAt = now + wait
        allowance = 1
        refilledAt = now + wait
        return wait
    }

    /// Whether a request may go out `now`; takes its place when it may.
    package mutating func admit(at now: ContinuousClock.Instant) -> Bool {
        if let pausedUntil {
            if pausedUntil > now { return false }
            self.pausedUntil = nil
        }
        guard var rate else { return true }
        while now - rateGrewAt >= window {
            rate *= 1.25
            rateGrewAt += window
        }
        if rate >= firstRate * 4 {
            self.rate = nil
            consecutivePauses = 0
            return true
        }
        self.rate = rate
        if now > refilledAt {
            allowance = min(max(1, rate / 10), allowance + rate * (now - refilledAt).seconds)
            refilledAt = now
        }
        guard allowance >= 1 else { return false }
        allowance -= 1
        return true
    }

    /// When the next request may go out, if not now (nil: now, or unpaced).
    package func nextAdmission(at now: ContinuousClock.Instant) -> ContinuousClock.Instant? {
        if let pausedUntil, pausedUntil > now { return pausedUntil }
        guard let rate, allowance < 1 else { return nil }
        return now + .seconds((1 - allowance) / rate)
    }

    /// True while sending is paused or paced.
    package var isSlowed: Bool { pausedUntil != nil || rate != nil }
}
