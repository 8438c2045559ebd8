import Runtime

/// Tells a wrong project from a few foreign tokens: FCM answers `SENDER_ID_MISMATCH` for a
/// token registered with another project than the one the credentials send for. A few of
/// them among many deliveries are tokens of another app (each row fails, its token is kept);
/// when, within `window`, at least `distinctTokens` different tokens got it and they are
/// more than half of the device answers in that window, the service account or
/// `--project-id` is wrong, and sending should stop until the credentials change.
///
/// A pure value: the transport feeds it each device answer with the time it came.
package struct SenderMismatchWatch: Sendable {
    /// How far back answers count.
    package let window: Duration
    /// Distinct tokens refused within the window that, as the majority of answers, stop sending.
    package let distinctTokens: Int
    /// The answers kept: at most this many of the latest (the share is computed over them).
    package let capacity: Int

    private var answers = FIFO<(at: ContinuousClock.Instant, mismatchedToken: String?)>()
    private var mismatches = 0

    package init(window: Duration = .seconds(60), distinctTokens: Int = 10, capacity: Int = 1000) {
        self.window = window
        self.distinctTokens = distinctTokens
        self.capacity = capacity
    }

    /// Records one device answer (`mismatch`: it was `SENDER_ID_MISMATCH`) and returns true
    /// when the answers now say the credentials send for the wrong project.
    package mutating func record(token: String, mismatch: Bool, at now: ContinuousClock.Instant) -> Bool {
        answers.append((now, mismatch ? token : nil))
        if mismatch { mismatches += 1 }
        while let first = answers.first, answers.count > capacity || now - first.at > window {
            if answers.popFirst()?.mismatchedToken != nil { mismatches -= 1 }
        }
        guard mismatch, mismatches >= distinctTokens, mismatches * 2 > answers.count else { return false }
        var distinct = Set<String>()
        for answer in answers.elements {
            if let token = answer.mismatchedToken { distinct.insert(token) }
        }
        return distinct.count >= distinctTokens
    }

    /// Forgets every answer (the credentials changed).
    package mutating func reset() {
        answers = FIFO()
        mismatches = 0
    }
}
