import Synchronization

/// A one-way switch from running to shutting down, observable from any task.
final class ShutdownSignal: Sendable {
    private struct State {
        var requested = false
        var hooks: [@Sendable () -> Void] = []
        var sleepers: [UInt64: CheckedContinuation<Void, Never>] = [:]
        var nextID: UInt64 = 0
    }
    private let state = Mutex(State())

    var isRequested: Bool { state.withLock { $0.requested } }

    /// Flips the switch: runs the hooks and wakes the sleepers. Idempotent.
    func request() {
        let (hooks, sleepers) = state.withLock { state -> ([@Sendable () -> Void], [CheckedContinuation<Void, Never>]) in
            guard !state.requested else { return ([], []) }
            state.requested = true
            defer { state.hooks.removeAll(); state.sleepers.removeAll() }
            return (state.hooks, Array(state.sleepers.values))
        }
        for hook in hooks { hook() }
        for sleeper in sleepers { sleeper.resume() }
    }

    /// Runs `hook` on shutdown (at once if it was already requested).
    func onRequest(_ hook: @escaping @Sendable () -> Void) {
        let runNow = state.withLock { state -> Bool in
            if state.requested { return true }
            state.hooks.append(hook)
            return false
        }
        if runNow { hook() }
    }

    /// Sleeps for `duration`, or less if shutdown is requested meanwhile.
    func sleep(for duration: Duration) async {
        let id = state.withLock { state -> UInt64 in
            state.nextID += 1
            return state.nextID
        }
        let timer = Task { [weak self] in
            try? await Task.sleep(for: duration)
            self?.wake(id)
        }
        defer { timer.cancel() }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let resumeNow = state.withLock { state -> Bool in
                if state.requested { return true }
                state.sleepers[id] = continuation
                return false
            }
            if resumeNow { continuation.resume() }
        }
    }

    private func wake(_ id: UInt64) {
        state.withLock { $0.sleepers.removeValue(forKey: id) }?.resume()
    }
}
