import Runtime
import Synchronization

/// Bytes waiting to be written by a stream's thread, bounded in size.
///
/// Any task may `enqueue`; when the buffer holds `capacity` bytes or more the caller
/// suspends until the stream's thread has taken enough out (backpressure from a slow peer
/// reaches the senders instead of growing memory). Order is first come, first written.
/// A chunk larger than the capacity is accepted when the buffer is empty.
///
/// A gate refuses some senders without ending the stream: once `closeGate()` ran,
/// `enqueueUnlessGateClosed` queues nothing and returns false (senders waiting for room
/// that way get false too), while `enqueue` and `enqueueWithoutWaiting` go on as before.
/// CCS uses it for `CONNECTION_DRAINING`: downstream messages stop, acks still flow.
package final class OutboundBuffer: Sendable {
    /// Bytes to write, with the largest TLS record they may be cut into.
    package struct Chunk: Sendable {
        package var bytes: [UInt8]
        /// Normally 16 KiB; the simulator uses 1 to send one byte per TLS record.
        package var recordSize: Int

        package init(bytes: [UInt8], recordSize: Int) {
            self.bytes = bytes
            self.recordSize = recordSize
        }
    }

    private struct Waiter {
        let id: UInt64
        let chunk: Chunk
        /// Refused (with `GateClosed`) when the gate closes while it waits.
        let gated: Bool
        let continuation: CheckedContinuation<Void, any Error>
    }

    /// Resumes a gated waiter when the gate closes; never leaves this type.
    private struct GateClosed: Error {}

    private struct State {
        var chunks: [Chunk] = []
        var bytes = 0
        var waiters: [Waiter] = []
        var nextWaiterID: UInt64 = 0
        var closedWith: (any Error)?
        var gateClosed = false
    }

    package let capacity: Int
    private let state = BlockingLock(State())
    /// Called (outside the lock) after something was enqueued, to wake the stream's thread.
    private let onEnqueue: @Sendable () -> Void

    package init(capacity: Int, onEnqueue: @escaping @Sendable () -> Void) {
        self.capacity = capacity
        self.onEnqueue = onEnqueue
    }

    /// Queues `chunk` at once, even past `capacity`: for small stanzas whose number the
    /// protocol bounds already (CCS acks: at most 100 unacked messages per connection),
    /// written from a thread that must not wait (the journal's).
    /// - Throws: the error the stream ended with.
    package func enqueueWithoutWaiting(_ chunk: Chunk) throws {
        try state.withLock { state throws in
            if let closed = state.closedWith { throw closed }
            state.chunks.append(chunk)
            state.bytes += chunk.bytes.count
        }
        onEnqueue()
    }

    /// Queues `chunk`, waiting for room first.
    /// - Throws: the error the stream ended with, or `CancellationError`.
    package func enqueue(_ chunk: Chunk) async throws {
        _ = try await enqueue(chunk, gated: false)
    }

    /// Queues `chunk` unless the gate is closed, waiting for room first. Returns false, with
    /// nothing queued, when the gate was closed before the chunk was queued.
    /// - Throws: the error the stream ended with, or `CancellationError`.
    package func enqueueUnlessGateClosed(_ chunk: Chunk) async throws -> Bool {
        try await enqueue(chunk, gated: true)
    }

    private func enqueue(_ chunk: Chunk, gated: Bool) async throws -> Bool {
        enum Admission { case queued, refused, waits(UInt64) }
        let admission = try state.withLock { state throws -> Admission in
            if let closed = state.closedWith { throw closed }
            if gated && state.gateClosed { return .refused }
            if state.waiters.isEmpty && (state.bytes == 0 || state.bytes + chunk.bytes.count <= capacity) {
                state.chunks.append(chunk)
                state.bytes += chunk.bytes.count
                return .queued
            }
            state.nextWaiterID += 1
            return .waits(state.nextWaiterID)
        }
        let id: UInt64
        switch admission {
        case .queued:
            onEnqueue()
            return true
        case .refused: return false
        case .waits(let waiter): id = waiter
        }
        do {
            try await withTaskCancellationHandler {
                try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                    let outcome = state.withLock { state -> Result<Bool, any Error> in
                        if let closed = state.closedWith { return .failure(closed) }
                        if gated && state.gateClosed { return .failure(GateClosed()) }
                        if Task.isCancelled { return .failure(CancellationError()) }
                        if state.waiters.isEmpty && (state.bytes == 0 || state.bytes + chunk.bytes.count <= capacity) {
                            state.chunks.append(chunk)
                            state.bytes += chunk.bytes.count
                            return .success(true)
                        }
                        state.waiters.append(Waiter(id: id, chunk: chunk, gated: gated, continuation: continuation))
                        return .success(false)
                    }
                    switch outcome {
                    case .failure(let error): continuation.resume(throwing: error)
                    case .success(true): continuation.resume(); onEnqueue()
                    case .success(false): break
                    }
                }
            } onCancel: {
                let waiter = state.withLock { state -> Waiter? in
                    guard let index = state.waiters.firstIndex(where: { $0.id == id }) else { return nil }
                    return state.waiters.remove(at: index)
                }
                waiter?.continuation.resume(throwing: CancellationError())
            }
        } catch is GateClosed {
            return false
        }
        return true
    }

    /// Takes everything queued (for the stream's thread), admitting waiting senders whose
    /// chunks now fit, and resumes them.
    package func takeAll() -> [Chunk] {
        let (chunks, admitted) = state.withLock { state -> ([Chunk], [Waiter]) in
            let taken = state.chunks
            state.chunks.removeAll(keepingCapacity: true)
            state.bytes = 0
            var admitted: [Waiter] = []
            while let next = state.waiters.first,
                  state.bytes == 0 || state.bytes + next.chunk.bytes.count <= capacity {
                state.waiters.removeFirst()
                state.chunks.append(next.chunk)
                state.bytes += next.chunk.bytes.count
                admitted.append(next)
            }
            return (taken, admitted)
        }
        for waiter in admitted { waiter.continuation.resume() }
        return chunks
    }

    /// Senders waiting for room (for tests and metrics).
    package var waiterCount: Int { state.withLock { $0.waiters.count } }

    /// Closes the gate: `enqueueUnlessGateClosed` refuses from now on, and its waiting
    /// senders get false. What is queued already can still be taken.
    package func closeGate() {
        let refused = state.withLock { state -> [Waiter] in
            state.gateClosed = true
            let refused = state.waiters.filter(\.gated)
            state.waiters.removeAll(where: \.gated)
            return refused
        }
        for waiter in refused { waiter.continuation.resume(throwing: GateClosed()) }
    }

    /// Whether `closeGate()` ran.
    package var isGateClosed: Bool { state.withLock { $0.gateClosed } }

    /// Refuses further chunks and fails the waiting senders with `error`; chunks already
    /// queued can still be taken.
    package func close(with error: any Error) {
        let waiters = state.withLock { state -> [Waiter] in
            if state.closedWith == nil { state.closedWith = error }
            let waiters = state.waiters
            state.waiters.removeAll()
            return waiters
        }
        for waiter in waiters { waiter.continuation.resume(throwing: error) }
    }
}
