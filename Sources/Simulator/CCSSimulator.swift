import FCM
import Foundation
import Synchronization
import XMPP
#if canImport(Glibc)
import Glibc
#endif
import Runtime
import Transport

/// A faithful stand-in for FCM's XMPP connection server (CCS) on loopback, over real TLS.
///
/// It enforces docs/protocol.md section 2: SASL PLAIN with the configured sender ID and server
/// key, bind, at most `maxPendingDownstream` pending downstream messages per connection,
/// acks only on the connection a message came in on, and redelivery of unacked upstream
/// messages after a connection is lost. Tests script it (inject upstream messages, answer
/// downstream ones, drain, drop, send raw bytes) and observe it through `events`,
/// `counters` and `wait(for:)`. Every rule the client breaks is recorded as a
/// `ProtocolViolation`.
public final class CCSSimulator: Sendable {
    /// An upstream message ready to deliver: its stanza is made once, up front.
    public struct UpstreamRecord: Sendable {
        let messageID: String
        /// Who the ack must be addressed to.
        let from: String
        /// The `<message>` stanza as the simulator writes it.
        public let stanza: String

        init(messageID: String, from: String, stanza: String) {
            self.messageID = messageID
            self.from = from
            self.stanza = stanza
        }

        /// A message from `from` whose payload is the JSON text `json` (holding that
        /// `message_id` and `from`), as a load generator makes them ahead of a run.
        public init(messageID: String, from: String, json: String) {
            self.init(messageID: messageID, from: from, stanza: CCSSimulator.upstreamStanza(json: json))
        }
    }

    /// An upstream message delivered and not acked yet. CCS delivers a message again when
    /// it saw no ack (after a lost connection), and a device may send one `message_id`
    /// twice: each delivery takes one ack, on the connection it went out on.
    struct InFlight: Sendable {
        struct Delivery: Sendable {
            let session: Int
            let deliveredAt: ContinuousClock.Instant
        }

        let record: UpstreamRecord
        /// The oldest delivery not acked yet, then the others in order (rarely any: no
        /// array is made for the usual single delivery).
        var first: Delivery
        var others: [Delivery] = []

        var session: Int { first.session }

        func wasDelivered(on session: Int) -> Bool {
            first.session == session || others.contains { $0.session == session }
        }

        /// Takes the oldest delivery on `session`; nil when none went out there.
        mutating func takeDelivery(on session: Int) -> (delivery: Delivery, remaining: Bool)? {
            if first.session == session {
                let taken = first
                guard !others.isEmpty else { return (taken, false) }
                first = others.removeFirst()
                return (taken, true)
            }
            guard let index = others.firstIndex(where: { $0.session == session }) else { return nil }
            return (others.remove(at: index), true)
        }
    }

    struct SessionHandle: Sendable {
        let loop: StreamLoop
        let mailbox: SessionMailbox
    }

    struct Waiter {
        let id: UInt64
        let predicate: @Sendable ([SimulatorEvent]) -> Bool
        let continuation: CheckedContinuation<Void, any Error>
    }

    struct State {
        var nextSessionID = 1
        var sessions: [Int: SessionHandle] = [:]
        var boundSessions: [Int] = []
        var events: [SimulatorEvent] = []
        var waiters: [Waiter] = []
        var nextWaiterID: UInt64 = 0
        var undelivered = FIFO<UpstreamRecord>()
        var targeted: [Int: [UpstreamRecord]] = [:]
        var inFlight: [String: InFlight] = [:]
        var recentlyAcked: Set<String> = []
        var recentlyAckedOrder: [String] = []
        var nextUpstreamNumber = 0
        var stopped = false
        var checkScheduled = false
    }

    public let configuration: SimulatorConfiguration
    /// The port it listens on.
    public let port: Int
    let state = BlockingLock(State())
    /// Totals, kept apart from `state` so that counting never waits for the big lock.
    private let totals = SimulatorTotals()
    /// Every upstream ack's latency in microseconds, for benchmarks.
    private let latencies = BlockingLock<[UInt32]>([])
    /// Waiters registered (read without the big lock on the hot path).
    private let waiterCount = Atomic<Int>(0)
    private let tls: TLSContext
    private let acceptLoop: AcceptLoop

    /// Binds the listening socket (so `port` is known) and starts accepting.
    public init(configuration: SimulatorConfiguration) throws {
        ProcessSignals.ignoreSIGPIPE()
        self.configuration = configuration
        self.tls = try TLSContext.server(identity: configuration.identity)
        acceptLoop = try AcceptLoop(host: configuration.host, port: configuration.port)
        self.port = acceptLoop.port
        acceptLoop.start(name: "ccs-simulator accept") { [self] fd in startSession(fd) }
    }

    /// Stops accepting and drops every connection. Once it returns the port is free: a
    /// simulator started on it next (a CCS that came back) can listen there.
    public func stop() {
        let handles = state.withLock { state -> [SessionHandle] in
            state.stopped = true
            return Array(state.sessions.values)
        }
        for handle in handles { handle.loop.requestClose(.abort(XMPPError.closedLocally)) }
        acceptLoop.stop()
    }

    // MARK: - Scripting

    /// Queues an upstream message from a device; it is delivered to `session` (or any bound
    /// session) as soon as flow control allows, and redelivered elsewhere if that
    /// connection is lost before the ack. Returns its message id.
    @discardableResult
    public func injectUpstream(from token: String = "device-token-1", category: String = "com.example.app",
                               data: [String: JSONValue] = [:], messageID: String? = nil,
                               extraFields: [String: JSONValue] = [:], session: Int? = nil) -> String {
        let id = messageID ?? state.withLock { state in
            state.nextUpstreamNumber += 1
            return "up-\(state.nextUpstreamNumber)"
        }
        var members = extraFields
        members["from"] = .string(token)
        members["category"] = .string(category)
        members["message_id"] = .string(id)
        members["data"] = .object(data)
        injectRaw(json: JSONValue.object(members).serialized, messageID: id, from: token, session: session)
        return id
    }

    /// Queues the upstream messages of JSON Lines text (`simulate --upstream-file`): one
    /// JSON object per line, as a device's upstream message, with `data` (an object),
    /// `from` (default `device-token-1`), `category` (default `defaultCategory`),
    /// `message_id` (default: the simulator's next `up-N`), and any other member sent as
    /// given. Blank lines and lines starting with `#` are skipped. Returns the message ids,
    /// in order.
    /// - Throws: `SimulatorError` naming the first line that is not such an object (nothing
    ///   is queued then).
    @discardableResult
    public func injectUpstream(jsonLines text: String, defaultCategory: String = "com.example.app") throws -> [String] {
        var messages: [(from: String, category: String, data: [String: JSONValue], id: String?, extra: [String: JSONValue])] = []
        for (number, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            guard !trimmed.isEmpty, !trimmed.hasPrefix("#") else { continue }
            func refuse(_ reason: String) -> SimulatorError { SimulatorError("upstream line \(number + 1): \(reason)") }
            guard case .object(var members)? = try? JSONValue.parse(trimmed) else { throw refuse("not a JSON object") }
            let from = members.removeValue(forKey: "from") ?? .string("device-token-1")
            let category = members.removeValue(forKey: "category") ?? .string(defaultCategory)
            let data = members.removeValue(forKey: "data") ?? .object([:])
            let id = members.removeValue(forKey: "message_id")
            guard case .string(let fromText) = from, !fromText.isEmpty else { throw refuse("from must be a non-empty string") }
            guard case .string(let categoryText) = category else { throw refuse("category must be a string") }
            guard case .object(let dataMembers) = data else { throw refuse("data must be a JSON object") }
            if let id, id.stringValue?.isEmpty != false { throw refuse("message_id must be a non-empty string") }
            messages.append((fromText, categoryText, dataMembers, id?.stringValue, members))
        }
        return messages.map { injectUpstream(from: $0.from, category: $0.category, data: $0.data, messageID: $0.id, extraFields: $0.extra) }
    }

    /// Queues prepared upstream messages, delivered like `injectUpstream`'s.
    public func injectUpstream<Records: Sequence>(_ records: Records) where Records.Element == UpstreamRecord {
        let handles = state.withLock { state -> [SessionHandle] in
            state.undelivered.append(contentsOf: records)
            return state.boundSessions.compactMap { state.sessions[$0] }
        }
        for handle in handles { handle.loop.wake() }
    }

    /// Queues an upstream stanza with arbitrary JSON (for messages missing fields).
    /// `messageID`/`from` say how an ack would be matched; pass nil when it cannot be acked.
    public func injectRaw(json: String, messageID: String?, from: String?, session: Int? = nil,
                          stanzaAttributes: String = " from=\"devices@gcm.googleapis.com\" type=\"normal\"", prefixedPayload: Bool = true) {
        let stanza = Self.upstreamStanza(json: json, attributes: stanzaAttributes, prefixedPayload: prefixedPayload)
        let record = UpstreamRecord(messageID: messageID ?? "", from: from ?? "", stanza: stanza)
        let handles = state.withLock { state -> [SessionHandle] in
            if let session {
                state.targeted[session, default: []].append(record)
                return state.sessions[session].map { [$0] } ?? []
            }
            state.undelivered.append(record)
            return state.boundSessions.compactMap { state.sessions[$0] }
        }
        for handle in handles { handle.loop.wake() }
    }

    /// An upstream `<message>` as CCS sends it: the stanza attributes CCS uses and, by
    /// default, the prefixed `<data:gcm>` form (clients must parse by namespace).
    static func upstreamStanza(json: String, attributes: String = " from=\"devices@gcm.googleapis.com\" type=\"normal\"",
                               prefixedPayload: Bool = true) -> String {
        let payload = XMLEscaping.escapeText(json)
        return prefixedPayload
            ? "<message\(attributes)><data:gcm xmlns:data=\"google:mobile:data\">\(payload)</data:gcm></message>"
            : "<message\(attributes)><gcm xmlns=\"google:mobile:data\">\(payload)</gcm></message>"
    }

    /// Sends `CONNECTION_DRAINING` on `session`; CCS closes it after `closeAfter` (nil: leave open).
    public func sendConnectionDraining(session: Int, closeAfter: Duration? = nil) {
        command(session, .draining(closeAfter: closeAfter))
    }

    /// Drops `session`'s TCP connection abruptly (no closing stream, no close_notify).
    public func drop(session: Int) { command(session, .drop) }

    /// Closes `session`'s stream cleanly.
    public func closeStream(session: Int) { command(session, .closeStream) }

    /// Sends `<stream:error>` with `condition` and closes the stream.
    public func sendStreamError(session: Int, condition: String, text: String? = nil) {
        command(session, .streamError(condition: condition, text: text))
    }

    /// Writes `bytes` as they are, cut into TLS records of `recordSize` bytes.
    public func sendRaw(session: Int, _ bytes: [UInt8], recordSize: Int = 16 * 1024) {
        command(session, .raw(bytes, recordSize: recordSize))
    }

    /// Sends a single-space whitespace keepalive.
    public func sendWhitespaceKeepalive(session: Int) { command(session, .raw([0x20], recordSize: 1)) }

    /// Stops reading from and writing to `session` (a hung peer): pings go unanswered.
    public func mute(session: Int) { command(session, .mute) }

    private func command(_ session: Int, _ command: SessionCommand) {
        guard let handle = state.withLock({ $0.sessions[session] }) else { return }
        handle.mailbox.post(command)
        handle.loop.wake()
    }

    // MARK: - Observing

    /// Every event so far, in order (empty when `recordsEvents` is off).
    public var events: [SimulatorEvent] { state.withLock { $0.events } }

    /// Totals so far.
    public var counters: SimulatorCounters { totals.snapshot }

    /// The latency of every upstream ack so far (delivery written → ack read), in
    /// microseconds, in arrival order.
    public var ackLatencyMicroseconds: [UInt32] { latencies.withLock { $0 } }

    /// The protocol violations recorded so far.
    public var violations: [ProtocolViolation] {
        events.compactMap { if case .violation(_, let violation) = $0 { violation } else { nil } }
    }

    /// The ids of the sessions that are bound and still open, oldest first.
    public var boundSessions: [Int] { state.withLock { $0.boundSessions } }

    /// Waits until `predicate` holds for the event log. The predicate runs under the
    /// simulator's lock: it may only look at the events it is given. The default timeout
    /// is an upper bound for a loaded machine, not a timing: the wait ends as soon as the
    /// predicate holds, and a worker started while dozens of tests load two cores has been
    /// seen to take more than 10 s to open a session (the busy pass of `scripts/test`).
    /// - Throws: `SimulatorError` naming `what` if it does not within `timeout`.
    public func wait(for what: String, timeout: Duration = .seconds(30),
                     until predicate: @escaping @Sendable ([SimulatorEvent]) -> Bool) async throws {
        let id = state.withLock { state -> UInt64 in
            state.nextWaiterID += 1
            return state.nextWaiterID
        }
        let timer = Task {
            try? await Task.sleep(for: timeout)
            let waiter = state.withLock { state -> Waiter? in
                guard let index = state.waiters.firstIndex(where: { $0.id == id }) else { return nil }
                return state.waiters.remove(at: index)
            }
            if waiter != nil { waiterCount.subtract(1, ordering: .releasing) }
            let recent = events.suffix(8).map { "\($0)" }.joined(separator: "\n  ")
            waiter?.continuation.resume(throwing: SimulatorError("timed out after \(timeout) waiting for \(what); last events:\n  \(recent)"))
        }
        defer { timer.cancel() }
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            let satisfied = state.withLock { state -> Bool in
                if predicate(state.events) { return true }
                state.waiters.append(Waiter(id: id, predicate: predicate, continuation: continuation))
                waiterCount.add(1, ordering: .releasing)
                return false
            }
            if satisfied { continuation.resume() }
        }
    }

    /// Waits until `count` sessions are bound and open; returns their ids (the timeout as
    /// in `wait(for:timeout:until:)`).
    @discardableResult
    public func waitForBoundSessions(_ count: Int, timeout: Duration = .seconds(30)) async throws -> [Int] {
        try await wait(for: "\(count) bound sessions", timeout: timeout) { $0.openBoundSessions.count >= count }
        return boundSessions
    }

    // MARK: - For sessions

    /// A session now has `pending` downstream messages unanswered.
    func notePending(_ pending: Int) { totals.notePending(pending) }

    func record(_ event: SimulatorEvent) {
        configuration.onEvent?(event)
        totals.count(event)
        if configuration.recordsAckLatencies, case .upstreamAcked(_, _, let latency) = event {
            let micros = latency.components.seconds * 1_000_000 + latency.components.attoseconds / 1_000_000_000_000
            latencies.withLock { $0.append(UInt32(clamping: micros)) }
        }
        guard configuration.recordsEvents || waiterCount.load(ordering: .acquiring) > 0 else { return }
        let ready = state.withLock { state -> Bool in
            state.events.append(event)
            // Waiters are checked by one coalesced pass a moment later, not on every event:
            // a predicate reads the whole log, and per-event checks would be quadratic.
            guard !state.waiters.isEmpty, !state.checkScheduled else { return false }
            state.checkScheduled = true
            return true
        }
        if ready {
            Task { [weak self] in
                try? await Task.sleep(for: .milliseconds(2))
                self?.checkWaiters()
            }
        }
    }

    private func checkWaiters() {
        let ready = state.withLock { state -> [Waiter] in
            state.checkScheduled = false
            let events = state.events
            var ready: [Waiter] = []
            state.waiters.removeAll { waiter in
                guard waiter.predicate(events) else { return false }
                ready.append(waiter)
                return true
            }
            return ready
        }
        waiterCount.subtract(ready.count, ordering: .releasing)
        for waiter in ready { waiter.continuation.resume() }
    }

    func sessionBound(_ session: Int, jid: String) {
        state.withLock { $0.boundSessions.append(session) }
        record(.bound(session: session, jid: jid))
    }

    /// Up to `limit` upstream messages for `session` (its own first), marked in flight.
    func takeUpstream(for session: Int, limit: Int) -> [UpstreamRecord] {
        guard limit > 0 else { return [] }
        return state.withLock { state in
            var taken: [UpstreamRecord] = []
            let now = ContinuousClock.now
            if var queue = state.targeted[session], !queue.isEmpty {
                let count = min(limit, queue.count)
                taken.append(contentsOf: queue.prefix(count))
                queue.removeFirst(count)
                state.targeted[session] = queue
            }
            taken += state.undelivered.popFirst(limit - taken.count)
            for record in taken where !record.messageID.isEmpty {
                let delivery = InFlight.Delivery(session: session, deliveredAt: now)
                if state.inFlight[record.messageID] != nil {
                    state.inFlight[record.messageID]!.others.append(delivery)
                } else {
                    state.inFlight[record.messageID] = InFlight(record: record, first: delivery)
                }
            }
            return taken
        }
    }

    enum AckOutcome { case accepted(latency: Duration), violation(ProtocolViolation) }

    /// Matches acks from `session` to the messages they acknowledge, under one lock.
    func acknowledge(_ acks: [(messageID: String, to: String?)], session: Int) -> [AckOutcome] {
        let now = ContinuousClock.now
        return state.withLock { state in
            acks.map { ack in
                let messageID = ack.messageID
                guard var inFlight = state.inFlight.removeValue(forKey: messageID) else {
                    return state.recentlyAcked.contains(messageID)
                        ? .violation(.duplicateAck(messageID)) : .violation(.ackForUnknownMessage(messageID))
                }
                // A refused ack leaves the message in flight (one lookup for the usual case).
                guard inFlight.wasDelivered(on: session) else {
                    state.inFlight[messageID] = inFlight
                    return .violation(.ackOnWrongConnection(messageID: messageID, deliveredOn: inFlight.session))
                }
                if let to = ack.to, to != inFlight.record.from {
                    state.inFlight[messageID] = inFlight
                    return .violation(.ackToWrongAddress(messageID: messageID, expected: inFlight.record.from, got: to))
                }
                let taken = inFlight.takeDelivery(on: session)
                if taken?.remaining == true { state.inFlight[messageID] = inFlight }
                state.recentlyAcked.insert(messageID)
                state.recentlyAckedOrder.append(messageID)
                if state.recentlyAckedOrder.count > 100_000 {
                    for old in state.recentlyAckedOrder.prefix(50_000) { state.recentlyAcked.remove(old) }
                    state.recentlyAckedOrder.removeFirst(50_000)
                }
                return .accepted(latency: now - (taken?.delivery.deliveredAt ?? now))
            }
        }
    }

    /// A session ended: its unacked upstream messages go back to the front of the queue to
    /// be redelivered on another connection, as CCS does.
    func sessionEnded(_ session: Int, reason: String) {
        let wake = state.withLock { state -> [SessionHandle] in
            state.sessions[session] = nil
            state.boundSessions.removeAll { $0 == session }
            // Each delivery on it that was not acked goes out again.
            var orphans: [(record: UpstreamRecord, deliveredAt: ContinuousClock.Instant)] = []
            for (messageID, inFlight) in state.inFlight where inFlight.wasDelivered(on: session) {
                var rest = inFlight
                while let (delivery, remaining) = rest.takeDelivery(on: session) {
                    orphans.append((inFlight.record, delivery.deliveredAt))
                    if !remaining {
                        state.inFlight[messageID] = nil
                        break
                    }
                    state.inFlight[messageID] = rest
                }
            }
            let orphanRecords = orphans.sorted { $0.deliveredAt < $1.deliveredAt }.map(\.record)
            let targeted = state.targeted.removeValue(forKey: session) ?? []
            state.undelivered.prepend(contentsOf: orphanRecords + targeted)
            return state.boundSessions.compactMap { state.sessions[$0] }
        }
        record(.closed(session: session, reason: reason))
        for handle in wake { handle.loop.wake() }
    }

    // MARK: - Sessions

    private func startSession(_ fd: Int32) {
        let mailbox = SessionMailbox()
        let id = state.withLock { state -> Int in
            defer { state.nextSessionID += 1 }
            return state.nextSessionID
        }
        let driver = SimulatedSession(id: id, simulator: self, mailbox: mailbox)
        let loop: StreamLoop
        do {
            loop = try StreamLoop(name: "ccs-simulator session \(id)", origin: .accepted(fd: fd), tlsContext: tls, role: .server,
                                  handshakeTimeout: .seconds(10), closingTail: "</stream:stream>", outboundCapacity: 1 << 20,
                                  niceness: configuration.threadNiceness, driver: driver)
        } catch {
            // Out of descriptors: the client sees the connection close, and connects again.
            close(fd)
            return
        }
        let accepted = state.withLock { state -> Bool in
            guard !state.stopped else { return false }
            state.sessions[id] = SessionHandle(loop: loop, mailbox: mailbox)
            return true
        }
        guard accepted else {
            close(fd)
            return
        }
        record(.connected(session: id))
        loop.start()
    }
}

/// A failure of the simulator itself or of a wait on it.
public struct SimulatorError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// Running totals with atomic counters.
final class SimulatorTotals: Sendable {
    private let sessionsBound = Atomic<Int>(0)
    private let upstreamDelivered = Atomic<Int>(0)
    private let upstreamAcked = Atomic<Int>(0)
    private let downstreamReceived = Atomic<Int>(0)
    private let downstreamAcked = Atomic<Int>(0)
    private let downstreamNacked = Atomic<Int>(0)
    private let violations = Atomic<Int>(0)
    private let peakPendingDownstream = Atomic<Int>(0)

    func notePending(_ pending: Int) {
        var current = peakPendingDownstream.load(ordering: .relaxed)
        while pending > current {
            let (exchanged, original) = peakPendingDownstream.compareExchange(expected: current, desired: pending, ordering: .relaxed)
            if exchanged { return }
            current = original
        }
    }

    func count(_ event: SimulatorEvent) {
        switch event {
        case .bound: sessionsBound.add(1, ordering: .relaxed)
        case .upstreamDelivered: upstreamDelivered.add(1, ordering: .relaxed)
        case .upstreamAcked: upstreamAcked.add(1, ordering: .relaxed)
        case .downstreamReceived: downstreamReceived.add(1, ordering: .relaxed)
        case .downstreamAnswered(_, _, let response):
            if case .ack = response { downstreamAcked.add(1, ordering: .relaxed) }
            if case .nack = response { downstreamNacked.add(1, ordering: .relaxed) }
        case .violation: violations.add(1, ordering: .relaxed)
        default: break
        }
    }

    var snapshot: SimulatorCounters {
        var counters = SimulatorCounters()
        counters.sessionsBound = sessionsBound.load(ordering: .relaxed)
        counters.upstreamDelivered = upstreamDelivered.load(ordering: .relaxed)
        counters.upstreamAcked = upstreamAcked.load(ordering: .relaxed)
        counters.downstreamReceived = downstreamReceived.load(ordering: .relaxed)
        counters.downstreamAcked = downstreamAcked.load(ordering: .relaxed)
        counters.downstreamNacked = downstreamNacked.load(ordering: .relaxed)
        counters.violations = violations.load(ordering: .relaxed)
        counters.peakPendingDownstream = peakPendingDownstream.load(ordering: .relaxed)
        return counters
    }
}
