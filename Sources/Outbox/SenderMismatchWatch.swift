import Runtime

/// Tells a wrong project from a few foreign tokens: FCM answers `SENDER_ID_MISMATCH` for a
/// token registered with another project than the one the credentials send for. A few of
/// them among many deliveries are tokens of another app (each row fails, its token is kept);
/// when, within `window`, at least `distinctTokens` different tokens got it and they are
/// more than half of the device answers in that window, the service account or
/// `--project-id` is wrong, and sending should stop until the credentials change.
///
/// A pure value: the transport feeds it each device answer with the time it came. An
/// answer costs a counter's increment; only mismatches are kept one by one (the latest
/// `capacity`).
package struct SenderMismatchWatch: Sendable {
    /// How far back answers count.
    package let window: Duration
    /// Distinct tokens refused within the window that, as the majority of answers, stop sending.
    package let distinctTokens: Int
    /// The mismatches kept one by one at most.
    package let capacity: Int

    private var answers: CountWindow
    private var mismatches = FIFO<(at: ContinuousClock.Instant, token: String)>()

    package init(window: Duration = .seconds(60), distinctTokens: Int = 10, capacity: Int = 1000, now: ContinuousClock.Instant = .now) {
        self.window = window
        self.distinctTokens = distinctTokens
        self.capacity = capacity
        answers = CountWindow(window: window, now: now)
    }

    /// Records one device answer (`mismatch`: it was `SENDER_ID_MISMATCH`) and returns true
    /// when the answers now say the credentials send for the wrong project.
    package mutating func record(token: String, mismatch: Bool, at now: ContinuousClock.Instant) -> Bool {
        answers.add(at: now)
        guard mismatch else { return false }
        mismatches.append((now, token))
        while let first = mismatches.first, mismatches.count > capacity || now - first.at > window {
            _ = mismatches.popFirst()
        }
        guard mismatches.count >= distinctTokens, mismatches.count * 2 > answers.total(at: now) else { return false }
        var distinct = Set<String>()
        for mismatch in mismatches.elements {
            distinct.insert(mismatch.token)
            if distinct.count >= distinctTokens { return true }
        }
        return false
    }

    /// Forgets every answer (the credentials changed).
    package mutating func reset(at now: ContinuousClock.Instant = .now) {
        answers.reset(at: now)
        mismatches = FIFO()
    }
}
