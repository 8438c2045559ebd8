import FCM
import Foundation
import Runtime
#if canImport(Glibc)
import Glibc
#endif

/// The journal of journal ack mode (`--ack-mode journal`): upstream messages are appended
/// to a local file and flushed to disk before their ack, so that a crash of the process
/// (or of the machine) after the ack loses nothing that was acked; the next start replays
/// the journal before reading from CCS, de-duplicated by message id like every replay.
///
/// - **Group commit.** Messages that arrive while a write is under way wait for the next
///   one: each write is one `write` and one `fdatasync` for everything queued, on a thread
///   of its own, and the acks of those messages go out right after it, one write per
///   connection. What waits is bounded by CCS itself (at most 100 unacked messages per
///   connection), so the queue needs no other bound.
/// - **Segments.** The journal is a series of files `<spool>.journal-NNNNNNNNNN`, records
///   in the spool's format (`Spool`: one checksummed line each; a record torn by a crash was
///   never acked and is set aside at replay). A segment is closed once it passes
///   `segmentBytes`, and deleted once every message in it has committed; when everything
///   written has committed and no message waits, the current segment is deleted too, so an
///   idle worker keeps no journal.
/// - **Space.** A segment is also cut early when the journal's filesystem is short of
///   space (once it holds a quarter of what is free, at least 64 KiB), so that the journal
///   never fills its own disk with records that have committed: closed segments go as their
///   messages commit. Before a failed write is tried again, the closed segments whose
///   messages all committed are deleted, and once a minute while writes fail the log says
///   how many bytes the write needs, how many are free, and where.
/// - **Failures.** A write that fails (disk full, I/O error, the folder gone) is retried,
///   from the last complete record (a torn tail is cut off first), with backoff from 100 ms
///   to 5 s, until it succeeds: its messages stay unacked meanwhile (CCS sends no more on a
///   connection that leaves 100 unacked), `/readyz` says why the worker is not ready, each
///   failure is counted, and once the disk takes the write the acks go out and receiving
///   resumes by itself. A shutdown gives up the retries: those messages were never acked,
///   and CCS redelivers them. They are handled if they reached the pipeline, exactly once.
///
/// The journal runs as a service: stopped (or cancelled), it writes and acks what is queued
/// and ends.
/// Its writer is a thread of its own, so that neither the flush nor the acks wait behind
/// handler work on the cooperative pool.
package final class UpstreamJournal: Service, CCSJournal {
    /// A message to journal, with the ack that goes out once it is on disk.
    struct Record: Sendable {
        let entry: Spool.Entry
        let ack: DurableAck
    }

    private struct State {
        var pending: [Record] = []
        /// The segment records go to now.
        var current: Int
        /// Bytes written to `current` so far.
        var currentBytes = 0
        /// Per segment, the messages not committed yet (absent: none).
        var outstanding: [Int: Int] = [:]
        /// Segments no longer written to, deleted once nothing in them is outstanding.
        var closed = Set<Int>()
        /// Set when the service stops: write what is queued, then end.
        var stopping = false
        /// The writer found nothing to do and waits to be woken.
        var idle = false
    }

    /// The open segment file, and the bytes free on its filesystem at the last look (every
    /// `spaceLookInterval`, and after a failed write). `@unchecked Sendable`: touched only on
    /// the journal's own thread.
    private final class SegmentFile: @unchecked Sendable {
        var freeBytes = Int.max
        var spaceLookedAt: ContinuousClock.Instant?
        var segment = -1
        var descriptor: Int32 = -1
        /// The file's size after its last complete, flushed write.
        var completeBytes: off_t = 0
        /// A write failed since: bytes past `completeBytes` may be a torn record.
        var torn = false

        func close() {
            if descriptor >= 0 { Glibc.close(descriptor) }
            descriptor = -1
            segment = -1
            torn = false
        }

        deinit { close() }
    }

    let spoolPath: String
    let segmentBytes: Int
    private let logger: Logger
    private let observer: WorkerObserver?
    private let metrics: any UpstreamMetrics
    private let state: BlockingLock<State>
    /// Wakes the writer (signalled after `state` changes; the writer checks `state` holding it).
    private let wakeup = ThreadCondition()
    private let disk = DedicatedThread(name: "fcm-journal")
    private let file = SegmentFile()
    private static let spaceLookInterval: Duration = .milliseconds(100)
    /// The smallest size a segment is cut at for want of space.
    static let minimumCutBytes = 64 << 10
    /// The writer thread's nice value (the connection threads' `--io-niceness`): an ack in
    /// journal mode waits for this thread's flush, so it must not queue behind database and
    /// handler work any more than the connection thread that sends the ack does.
    private let niceness: Int32?

    package var name: String { "journal" }

    /// - Parameters:
    ///   - spoolPath: the spool file's path; the segments live beside it, under its lock.
    ///   - segmentBytes: the size after which a segment is closed for a new one.
    ///   - niceness: the writer thread's nice value, nil to leave it.
    package init(spoolPath: String, segmentBytes: Int = 16 << 20, niceness: Int32? = nil, logger: Logger, observer: WorkerObserver?,
         metrics: any UpstreamMetrics) {
        self.spoolPath = spoolPath
        self.niceness = niceness
        self.segmentBytes = segmentBytes
        self.logger = logger
        self.observer = observer
        self.metrics = metrics
        // Segments a replay could not finish are kept: new ones are numbered after them.
        let last = Self.segments(beside: spoolPath).last.map(\.number) ?? 0
        self.state = BlockingLock(State(current: last + 1))
    }

    /// The journal segments beside the spool at `spoolPath`, oldest first.
    package static func segments(beside spoolPath: String) -> [(number: Int, path: String)] {
        let folder = (spoolPath as NSString).deletingLastPathComponent
        let prefix = (spoolPath as NSString).lastPathComponent + ".journal-"
        let names = (try? FileManager.default.contentsOfDirectory(atPath: folder.isEmpty ? "." : folder)) ?? []
        return names.compactMap { name -> (Int, String)? in
            guard name.hasPrefix(prefix), let number = Int(name.dropFirst(prefix.count)) else { return nil }
            return (number, folder.isEmpty ? name : folder + "/" + name)
        }.sorted { $0.0 < $1.0 }
    }

    /// The path of segment `number`.
    func path(of number: Int) -> String {
        spoolPath + ".journal-" + String(repeating: "0", count: max(0, 10 - String(number).count)) + String(number)
    }

    /// A connection's message: the writer is woken by `writeAppended`, which the connection
    /// calls once it has parsed the whole read the message came in.
    package func append(payload: String, connection: String, receivedAt: Date, ack: DurableAck) -> Int {
        queue([Record(entry: Spool.Entry(connection: connection, payload: payload, receivedAt: receivedAt.timeIntervalSince1970),
                      ack: ack)])
    }

    /// Queues `records` for the next write and returns the segment they go to: pass it to
    /// `release` once per record when the record's message has committed.
    func append(_ records: [Record]) -> Int {
        let segment = queue(records)
        wake()
        return segment
    }

    /// A connection has parsed a read: what it appended goes in the writer's next turn.
    package func writeAppended() {
        wake()
    }

    private func queue(_ records: [Record]) -> Int {
        state.withLock { state in
            state.pending += records
            state.outstanding[state.current, default: 0] += records.count
            return state.current
        }
    }

    /// Messages of these segments (one entry per message) committed: a segment whose
    /// messages all have can go.
    func release(_ segments: [Int]) {
        guard !segments.isEmpty else { return }
        let wake = state.withLock { state in
            var wake = false
            for segment in segments {
                let left = (state.outstanding[segment] ?? 1) - 1
                if left > 0 {
                    state.outstanding[segment] = left
                } else {
                    state.outstanding[segment] = nil
                    if state.closed.contains(segment) || segment == state.current { wake = true }
                }
            }
            return wake
        }
        if wake { self.wake() }
    }

    /// Whether the writer waits to be woken (for tests: what is appended now waits for a wake).
    var writerIsIdle: Bool { state.withLock { $0.idle } }

    /// Messages queued or written but not committed yet.
    var outstanding: Int { state.withLock { $0.outstanding.values.reduce(0, +) } }

    /// Runs the writer on the journal's own thread until its stage stops (or the task is
    /// cancelled: the thread cannot be interrupted either way); then it writes and acks what
    /// is queued, and this returns.
    package func run(until stop: ShutdownSignal) async {
        stop.onRequest { [self] in stopWriting() }
        await withTaskCancellationHandler {
            _ = try? await disk.run { [self] in writeUntilStopped() }
        } onCancel: {
            stopWriting()
        }
        disk.shutdown()
        let left = outstanding
        if left > 0 {
            logger.warning("\(left) journaled message(s) did not commit before the shutdown ended: they stay in the journal "
                           + "beside \(spoolPath), and the next start replays them (keep that disk)")
        }
    }

    private func stopWriting() {
        state.withLock { $0.stopping = true }
        wake()
    }

    private func wake() {
        wakeup.wake()
    }

    /// What one turn of the writer does.
    private struct Turn {
        var records: [Record]
        var segment: Int
        var closing: Bool
        var deletable: Set<Int>
        var stopping: Bool
    }

    /// The writer's loop, on the journal's thread: waits for records (or segments to
    /// delete), writes and flushes them, sends their acks; ends once stopping with nothing
    /// left. Nothing here waits on the cooperative pool: an ack leaves a flush or two
    /// after its message arrived, however busy the pool is.
    private func writeUntilStopped() {
        if let niceness { ThreadPriority.setCurrentThread(niceness: niceness) }
        while true {
            wakeup.lock()
            var turn: Turn?
            while true {
                turn = state.withLock { state in
                    let turn = nextTurn(&state)
                    state.idle = turn == nil
                    return turn
                }
                if turn != nil { break }
                wakeup.wait()
            }
            wakeup.unlock()
            guard let turn else { continue }
            delete(turn.deletable)
            if !turn.records.isEmpty { write(turn.records, to: turn.segment) }
            // Every turn once space is short (a fast flow fills a small disk within the interval).
            lookAtSpace(every: file.freeBytes < 64 << 20 ? .zero : Self.spaceLookInterval)
            if turn.closing { file.close() }
            if turn.stopping && turn.records.isEmpty { return }
        }
    }

    /// Deletes journal segments (on the journal's thread).
    private func delete(_ segments: Set<Int>) {
        for number in segments.sorted() {
            if file.segment == number { file.close() }
            if unlink(path(of: number)) != 0 && errno != ENOENT {
                logger.warning("cannot delete the journal segment \(path(of: number)): \(String(cString: strerror(errno)))")
            }
        }
    }

    /// Reads the bytes free on the journal's filesystem, unless it did within `interval`.
    private func lookAtSpace(every interval: Duration) {
        let now = ContinuousClock.now
        if let lookedAt = file.spaceLookedAt, now - lookedAt < interval { return }
        file.spaceLookedAt = now
        var info = statvfs()
        let folder = (spoolPath as NSString).deletingLastPathComponent
        guard statvfs(folder.isEmpty ? "." : folder, &info) == 0 else { return }
        file.freeBytes = Int(clamping: UInt64(info.f_bavail) &* UInt64(info.f_frsize))
    }

    /// The size at which the current segment is cut: `segmentBytes`, or less when space is
    /// short (a quarter of what is free, at least `minimumCutBytes`).
    private var cutBytes: Int { min(segmentBytes, max(Self.minimumCutBytes, file.freeBytes / 4)) }

    /// Takes what the writer is to do now, or nil when there is nothing (it then waits).
    private func nextTurn(_ state: inout State) -> Turn? {
        let records = state.pending
        state.pending.removeAll(keepingCapacity: true)
        let segment = state.current
        var closing = false
        var deletable = state.closed.filter { state.outstanding[$0] == nil }
        state.closed.subtract(deletable)
        if !records.isEmpty && state.currentBytes >= cutBytes {
            // These records still go to the full segment: what comes next starts a new one.
            closing = true
            state.closed.insert(segment)
            state.current += 1
            state.currentBytes = 0
        } else if records.isEmpty && state.outstanding[segment] == nil && state.currentBytes > 0 {
            // Everything written has committed and nothing waits: no journal is needed.
            deletable.insert(segment)
            state.current += 1
            state.currentBytes = 0
        }
        guard !records.isEmpty || !deletable.isEmpty || state.stopping else { return nil }
        return Turn(records: records, segment: segment, closing: closing, deletable: deletable, stopping: state.stopping)
    }

    /// Writes `records` to `segment`, flushes them, then sends their acks. A failed write
    /// is tried again (with backoff) until it succeeds, or the journal stops.
    private func write(_ records: [Record], to segment: Int) {
        var written = 0
        var retry = Backoff(base: .milliseconds(100), cap: .seconds(5), jitter: .none)
        var failures = 0
        var lastSaid = ContinuousClock.now
        while true {
            let started = ContinuousClock.now
            do {
                written = try writeAndFlush(records, to: segment)
                let took = (ContinuousClock.now - started).seconds
                metrics.journalFlushed(seconds: took, records: records.count)
                break
            } catch {
                failures += 1
                metrics.journalFailed("\(error)")
                // Room made first: closed segments whose messages all committed go now, not
                // on a turn a stuck write never gives.
                let deletable = state.withLock { state -> Set<Int> in
                    let deletable = state.closed.filter { state.outstanding[$0] == nil }
                    state.closed.subtract(deletable)
                    return deletable
                }
                delete(deletable)
                lookAtSpace(every: .zero)
                if failures == 1 || ContinuousClock.now - lastSaid >= .seconds(60) {
                    lastSaid = .now
                    let waiting = records.count + state.withLock { $0.pending.count }
                    let needed = records.reduce(0) { $0 + $1.entry.payload.utf8.count + 128 }
                    let free = file.freeBytes == Int.max ? "unknown" : "\(file.freeBytes)"
                    logger.error("could not write the journal \(path(of: segment)): \(error); it needs about \(needed) byte(s), "
                                 + "\(free) are free on its filesystem; \(waiting) message(s) wait unacked, and the write is tried "
                                 + "again until the disk takes it (said once a minute)")
                }
                let delay = retry.next()
                guard waitUnlessStopping(for: delay) else {
                    logger.error("shutting down with \(records.count) message(s) neither journaled nor acked: CCS redelivers them")
                    metrics.journalRecovered()
                    return
                }
            }
        }
        if failures > 0 {
            metrics.journalRecovered()
            logger.notice("the journal \(path(of: segment)) is written again after \(failures) failed attempt(s); "
                          + "\(records.count) message(s) acked")
        }
        state.withLock { state in
            if state.current == segment { state.currentBytes += written }
        }
        for sent in DurableAck.sendWithoutWaiting(records.map(\.ack)) {
            if let error = sent.error {
                logger.warning("could not ack \(sent.messageIDs.count) journaled message(s) on \(sent.connection): \(error); "
                               + "CCS will redeliver them")
                continue
            }
            metrics.durablyAcked(sent.messageIDs.count)
            if let observer {
                for messageID in sent.messageIDs { observer(.acked(connection: sent.connection, messageID: messageID)) }
            }
        }
    }

    /// Waits `delay` on the journal's thread; false at once when the journal is stopping.
    private func waitUnlessStopping(for delay: Duration) -> Bool {
        let until = ContinuousClock.now + delay
        return wakeup.withLock {
            while !state.withLock({ $0.stopping }) {
                guard wakeup.wait(until: until) else { return true }
            }
            return false
        }
    }

    /// On the journal's thread: appends the records to `segment` (opened, and its creation
    /// made durable, when new) in one write, then `fdatasync`. Returns the bytes written.
    /// After a failed write, what it may have left past the last complete record is cut
    /// off first, so that no record follows a torn one.
    private func writeAndFlush(_ records: [Record], to segment: Int) throws -> Int {
        if file.segment != segment {
            file.close()
            let path = path(of: segment)
            let descriptor = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o600)
            guard descriptor >= 0 else { throw SpoolError("cannot open \(path): \(String(cString: strerror(errno)))") }
            file.descriptor = descriptor
            file.segment = segment
            file.completeBytes = lseek(descriptor, 0, SEEK_END)
            try Spool.syncFolder(of: path)
        }
        if file.torn {
            guard ftruncate(file.descriptor, file.completeBytes) == 0 else {
                throw SpoolError("cannot cut the torn end of \(path(of: segment)): \(String(cString: strerror(errno)))")
            }
            file.torn = false
        }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(records.count * 512)
        for record in records { Spool.appendRecord(record.entry, to: &bytes) }
        do {
            try bytes.withUnsafeBytes { try Spool.writeAll($0, to: file.descriptor, path: path(of: segment)) }
            guard fdatasync(file.descriptor) == 0 else {
                throw SpoolError("cannot flush \(path(of: segment)) to disk: \(String(cString: strerror(errno)))")
            }
        } catch {
            file.torn = true
            throw error
        }
        file.completeBytes += off_t(bytes.count)
        return bytes.count
    }
}
