/// A `DeadlineClock` that stands still until a test moves it (`advance(by:)`): the actions
/// whose deadlines that passes run then, in deadline order, on the caller's thread.
package final class ManualClock: DeadlineClock {
    private struct State {
        var now: ContinuousClock.Instant
        var lastID: UInt64 = 0
        /// Scheduled actions, neither run nor cancelled.
        var actions: [UInt64: (deadline: ContinuousClock.Instant, action: @Sendable () -> Void)] = [:]
    }

    private let state: BlockingLock<State>

    /// A clock standing at the real clock's present instant.
    package init() {
        state = BlockingLock(State(now: .now))
    }

    package var now: ContinuousClock.Instant { state.withLock { $0.now } }

    @discardableResult
    package func schedule(at deadline: ContinuousClock.Instant, _ action: @escaping @Sendable () -> Void) -> DeadlineTicket {
        let (ticket, runNow) = state.withLock { state -> (DeadlineTicket, Bool) in
            state.lastID += 1
            guard deadline > state.now else { return (DeadlineTicket(id: state.lastID), true) }
            state.actions[state.lastID] = (deadline, action)
            return (DeadlineTicket(id: state.lastID), false)
        }
        if runNow { action() }
        return ticket
    }

    @discardableResult
    package func cancel(_ ticket: DeadlineTicket) -> Bool {
        state.withLock { $0.actions.removeValue(forKey: ticket.id) != nil }
    }

    /// Actions scheduled and neither run nor cancelled: a test waits until the code it
    /// drives has started its timed wait before it moves the clock.
    package var scheduledCount: Int { state.withLock { $0.actions.count } }

    /// The earliest deadline of the actions scheduled (nil: none): a test waits until the
    /// code it drives waits for the deadline it expects.
    package var nextDeadline: ContinuousClock.Instant? { state.withLock { $0.actions.values.map(\.deadline).min() } }

    /// Moves the clock on by `duration` and runs the actions that fall due, earliest first.
    package func advance(by duration: Duration) {
        let due = state.withLock { state -> [@Sendable () -> Void] in
            state.now += duration
            let now = state.now
            let due = state.actions.filter { $0.value.deadline <= now }.sorted { ($0.value.deadline, $0.key) < ($1.value.deadline, $1.key) }
            for (id, _) in due { state.actions[id] = nil }
            return due.map(\.value.action)
        }
        for action in due { action() }
    }
}
