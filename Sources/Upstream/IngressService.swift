import FCM
import Foundation
import Ingress
import Runtime
import Synchronization
import Transport

/// The HTTPS ingress: devices post upstream messages (`POST /v1/messages`, `POST
/// /v1/messages:batch`), each checked (tokens, limits, rate), handed to the same pipeline
/// as CCS's messages, and answered as the ack mode promises (docs/ingress.md): immediate
/// once queued, journal once on disk, durable once committed. Every refusal has a JSON body
/// with a reason code; nothing is answered 200 that might be lost in that mode.
///
/// Runs as two services, like CCS's connections: `receiving` stops taking requests when
/// the shutdown begins (HTTP/2 GOAWAY, `Connection: close`), `connections` keeps the open
/// ones until the pipeline has committed, so that durable answers still go out.
package final class IngressService: Sendable {
    let settings: IngressSettings
    private let pipeline: UpstreamPipeline
    private let journal: UpstreamJournal?
    private let ackMode: CCSAckMode
    private let authenticator: IngressAuthenticator
    private let rateLimit: SenderRateLimit
    private let metrics: IngressMetrics
    private let logger: Logger
    private let reloads: ReloadGeneration
    private let observer: WorkerObserver?
    private let server: HTTPServer
    private let stopping = Atomic(false)
    private let serving = Atomic(false)
    /// Each sender's id prefix (`IngressMessageID.prefix`), kept: a sender posts again and
    /// again, and a digest per message cost more than finding it here. Emptied at 100,000.
    private let idPrefixes = BlockingLock<[String: String]>([:])
    /// Requests whose messages found the lanes full, waiting for room (`--ingress-queue-wait`).
    private let waitingRoom: IngressWaitingRoom

    /// Opens the listening socket and prepares the key sources (nothing served before `receiving` runs).
    /// - Throws: `ConfigurationError` for an address that cannot be listened on, a
    ///   certificate or key that cannot be read, or a key URL that is not https.
    package init(settings: IngressSettings, trust: TLSTrust, pipeline: UpstreamPipeline, journal: UpstreamJournal?, ackMode: CCSAckMode,
         metrics: IngressMetrics, reloads: ReloadGeneration, observer: WorkerObserver?, logger: Logger) throws(ConfigurationError) {
        if let problem = settings.problem { throw ConfigurationError(problem) }
        self.settings = settings
        self.pipeline = pipeline
        self.journal = journal
        self.ackMode = ackMode
        self.metrics = metrics
        self.logger = logger
        self.reloads = reloads
        self.observer = observer
        self.rateLimit = SenderRateLimit(perSecond: settings.ratePerSecond, burst: settings.rateBurst)
        // As many requests may wait as the lanes hold messages.
        self.waitingRoom = IngressWaitingRoom(maximumWait: settings.queueWait, capacity: max(1, pipeline.capacity), metrics: metrics)
        var checks: [(rules: FirebaseTokenRules, keys: FirebaseKeySource)] = []
        for kind in settings.authentication.kinds {
            let url = kind == .idToken ? settings.idTokenKeysURL : settings.appCheckKeysURL
            do {
                let source = try FirebaseKeySource(url: url, trust: trust, logger: logger)
                checks.append((FirebaseTokenRules(kind: kind, projectID: settings.projectID ?? "", projectNumber: settings.projectNumber,
                                                  clockSkew: settings.clockSkew), source))
                metrics.keySources.withLock { $0.append((kind.rawValue, source)) }
            } catch {
                throw ConfigurationError("invalid \(kind.rawValue) key URL \(url): \(error)")
            }
        }
        authenticator = IngressAuthenticator(checks: checks)
        let tls = try settings.plain ? nil : Self.tlsContext(settings)
        let (host, port) = settings.hostAndPort!
        // A handshake not done holds its slot for less than an idle connection may.
        let limits = HTTPServerLimits(maximumBodyBytes: settings.maximumBodyBytes, maximumHeadBytes: IngressSettings.maximumHeadBytes,
                                      maximumConcurrentStreams: settings.maximumStreamsPerConnection, idleTimeout: settings.idleTimeout,
                                      requestTimeout: settings.requestTimeout,
                                      handshakeTimeout: min(.seconds(10), settings.idleTimeout / 2))
        let handling = Handling()
        let throttle = WarningThrottle(interval: .seconds(60))
        let observer = HTTPServerObserver(refusedRequest: { status, reason in
            metrics.refusedByHTTP(status: status, reason: reason)
        }, refusedConnection: { reason in
            metrics.refusedConnection(reason: reason)
            guard let leftOut = throttle.admit("refused-\(reason)") else { return }
            let why = switch reason {
            case "full": "at --ingress-max-connections (\(settings.maximumConnections))"
            case "descriptors": "out of file descriptors (raise the worker's limit: see docs/operations.md)"
            default: "shutting down"
            }
            logger.warning("refused a connection: \(why)" + (leftOut > 0 ? " (\(leftOut) more refused since the last line)" : ""))
        }, timedOut: { what in
            metrics.timedOutConnection(what)
        })
        do {
            server = try HTTPServer(host: host, port: port, tls: tls, name: "ingress", limits: limits,
                                    maximumConnections: settings.maximumConnections, observer: observer) { requests in handling.handle(requests) }
        } catch {
            throw ConfigurationError("cannot serve the ingress on \(settings.address): \(error)")
        }
        let server = server
        metrics.connectionGauges.withLock { $0 = ({ server.openCount }, settings.maximumConnections) }
        handling.service.withLock { $0 = self }
    }

    /// Why posts cannot be taken now, for `/readyz` (nil when they can): not serving yet, at
    /// the connection limit, a key set the auth mode needs not loaded, or (durable mode) the
    /// database unavailable, each of which refuses what a device posts.
    package var unreadiness: String? {
        guard isServing else { return "the HTTPS ingress is not serving" }
        if server.isFull { return "the HTTPS ingress is at --ingress-max-connections (\(settings.maximumConnections))" }
        for source in authenticator.keySources where source.keys == nil {
            return "the HTTPS ingress has no signing keys from \(source.url) yet (tokens are refused 503)"
        }
        if ackMode == .durable && pipeline.isDatabaseDown {
            return "the database is unavailable: durable posts are refused until a commit succeeds"
        }
        return nil
    }

    /// The port listened on (the one asked for, or the system's choice for port 0).
    var port: Int { server.port }

    /// True from when it takes requests until it stops taking them.
    package var isServing: Bool { serving.load(ordering: .relaxed) }

    /// Lets the server's closure reach the service without a cycle at init.
    private final class Handling: Sendable {
        let service = BlockingLock<IngressService?>(nil)
        func handle(_ requests: [HTTPServerRequest]) -> [HTTPServerAction] {
            guard let service = service.withLock({ $0 }) else {
                return requests.map { _ in .respond(IngressService.refusal(503, "starting", "the worker is starting", retryAfter: 1)) }
            }
            return service.handle(requests)
        }
    }

    private static func tlsContext(_ settings: IngressSettings) throws(ConfigurationError) -> TLSContext {
        guard let certificateFile = settings.certificateFile, let keyFile = settings.keyFile else {
            throw ConfigurationError("the ingress needs --ingress-tls-cert and --ingress-tls-key")
        }
        guard let chain = try? String(contentsOfFile: certificateFile, encoding: .utf8) else {
            throw ConfigurationError("cannot read the ingress certificate \(certificateFile)")
        }
        guard let key = try? String(contentsOfFile: keyFile, encoding: .utf8) else {
            throw ConfigurationError("cannot read the ingress key \(keyFile)")
        }
        do {
            return try TLSContext.server(identity: TLSIdentity(certificateChainPEM: chain, privateKeyPEM: key), offersHTTP2: true)
        } catch {
            throw ConfigurationError("the ingress certificate \(certificateFile) and key \(keyFile) cannot be used: \(error)")
        }
    }

    /// Serves until the stage stops: fetches the key sets (and keeps them fresh), reloads
    /// the certificate on SIGHUP, then stops taking requests.
    package var receiving: some Service { Receiving(ingress: self) }

    /// Keeps the open connections until its stage stops (answers of committed messages go
    /// out meanwhile), then waits up to a second for them to close.
    package var connections: some Service { Connections(ingress: self) }

    private struct Receiving: Service {
        let ingress: IngressService
        var name: String { "ingress" }
        func run(until stop: ShutdownSignal) async {
            await ingress.serve(until: stop)
        }
    }

    private struct Connections: Service {
        let ingress: IngressService
        var name: String { "ingress connections" }
        func run(until stop: ShutdownSignal) async {
            await stop.wait()
            await ingress.server.waitUntilClosed(timeout: .seconds(1))
        }
    }

    /// Descriptors a worker needs besides its ingress connections (its own files, CCS and
    /// database connections, their wake pipes), and what each ingress connection takes.
    static let descriptorsBesidesConnections = 256
    static let descriptorsPerConnection = 1

    /// Raises the descriptor limit as far as the system lets this process, and says how many
    /// connections it allows (a warning when fewer than `--ingress-max-connections`).
    private func raiseDescriptorLimit() {
        let (before, after) = DescriptorLimit.raiseToHard()
        let room = max(0, (after - Self.descriptorsBesidesConnections) / Self.descriptorsPerConnection)
        let raised = after > before ? " (raised from \(before))" : ""
        if room < settings.maximumConnections {
            logger.warning("the file descriptor limit is \(after)\(raised): room for about \(room) ingress connections, fewer than "
                           + "--ingress-max-connections \(settings.maximumConnections); connections past it are refused. Raise the hard "
                           + "limit to at least \(settings.maximumConnections * Self.descriptorsPerConnection + Self.descriptorsBesidesConnections) "
                           + "(LimitNOFILE=, ulimit -Hn)")
        } else {
            logger.info("file descriptor limit \(after == Int.max ? "unlimited" : String(after))\(raised): room for the \(settings.maximumConnections) ingress connections")
        }
    }

    private func serve(until stop: ShutdownSignal) async {
        raiseDescriptorLimit()
        // Served at once, ready (`/readyz`) once the key sets are here: each is fetched once
        // now (the first fetch of its refresh loop), and the start is announced after.
        server.start()
        serving.store(true, ordering: .relaxed)
        await withTaskGroup(of: Void.self) { group in
            let firstFetches = BlockingLock(authenticator.keySources.count)
            let fetched = Doorbell()
            for source in authenticator.keySources {
                group.addTask {
                    await source.run(until: stop) {
                        if firstFetches.withLock({ $0 -= 1; return $0 }) == 0 { fetched.ring() }
                    }
                }
            }
            if !authenticator.keySources.isEmpty { await fetched.wait(timeout: .seconds(15)) }
            observer?(.servingIngress(port: server.port))
            logger.info("HTTPS ingress on \(settings.address) (port \(server.port), \(settings.plain ? "plain HTTP/1.1 and h2c" : "TLS, h2 and HTTP/1.1"), "
                        + "auth \(settings.authentication.rawValue), ack mode \(ackMode.rawValue))")
            group.addTask { await self.reloadCertificates(until: stop) }
            group.addTask { await self.letTheWaitingMove(until: stop) }
            await stop.wait()
            stopping.store(true, ordering: .relaxed)
            serving.store(false, ordering: .relaxed)
            // What still waits for room was never queued: it is answered 503 (post again).
            waitingRoom.stop()
            moveTheWaiting()
            server.drain()
            logger.info("HTTPS ingress stopped taking requests (\(server.openCount) connection(s) finishing)")
            await group.waitForAll()
        }
    }

    /// On SIGHUP, reads the certificate and key again: new connections use them, open
    /// ones keep theirs. A pair that cannot be used is logged and the old one kept.
    private func reloadCertificates(until stop: ShutdownSignal) async {
        guard !settings.plain else { return }
        var seen = reloads.value
        let changed = Doorbell()
        reloads.onRequest { changed.ring() }
        stop.onRequest { changed.ring() }
        // Woken by a reload request or the stop; a cancelled wait returns at once, and the
        // loop ends then.
        while true {
            await changed.wait(timeout: .seconds(3600))
            if stop.isRequested || Task.isCancelled { return }
            guard reloads.value != seen else { continue }
            seen = reloads.value
            do {
                server.replaceTLS(try Self.tlsContext(settings))
                logger.notice("reloaded the ingress certificate \(settings.certificateFile ?? ""): new connections use it")
            } catch {
                logger.error("could not reload the ingress certificate: \(error); the one loaded before is kept")
            }
        }
    }

    /// Lets the waiting requests move whenever a full lane had work taken from it, and at
    /// least every 50 ms (to answer those that waited `--ingress-queue-wait` in vain).
    private func letTheWaitingMove(until stop: ShutdownSignal) async {
        guard settings.queueWait > .zero else { return }
        while !stop.isRequested && !Task.isCancelled {
            await pipeline.room.wait(timeout: .milliseconds(50))
            if waitingRoom.isOccupied { moveTheWaiting() }
        }
    }

    /// Queues the waiting requests that now fit, in their order, and answers those that
    /// waited too long (or, stopping, all of them) 503.
    private func moveTheWaiting() {
        waitingRoom.move(queue: { group in
            guard hand(&group.work, records: group.records) else { return false }
            for (reply, response) in group.replies {
                guard let response else { continue }
                metrics.answered(status: 200, reason: "ok", after: ContinuousClock.now - group.arrived)
                reply.send(response)
            }
            return true
        }, refuse: { group in
            let reason = stopping.load(ordering: .relaxed) ? "shutting_down" : "overloaded"
            let response = Self.refusal(503, reason, reason == "overloaded"
                                        ? "the worker's queues stayed full for \(settings.queueWait.formattedSeconds); post again later"
                                        : "the worker is shutting down; post again (another instance answers)", retryAfter: 1)
            for (reply, _) in group.replies {
                metrics.answered(status: 503, reason: reason, after: ContinuousClock.now - group.arrived)
                reply.send(response)
            }
        })
    }

    // MARK: - Requests (on the connection's thread: nothing here waits)

    /// A request that passed every check, its messages ready for the pipeline.
    private struct Admitted {
        /// Its place among the read's requests.
        let index: Int
        let clientIDs: [String]
        /// A refused message's status, nil for those queued.
        let statuses: [String?]
        let batch: Bool
        var work: [UpstreamWork]
        var records: [UpstreamJournal.Record]
        /// The way to answer it later (when it waits for room, or for its acks).
        let reply: HTTPServerReply
    }

    private enum Checked {
        case refused(HTTPServerAction)
        case admitted(Admitted)
    }

    /// The requests one read of a connection completed: each checked on its own, the
    /// messages of those admitted queued together (one hand-over to the pipeline, and in
    /// journal mode one append, per read, as CCS's reads are).
    private func handle(_ requests: [HTTPServerRequest]) -> [HTTPServerAction] {
        let started = ContinuousClock.now
        var actions: [HTTPServerAction] = []
        actions.reserveCapacity(requests.count)
        var admitted: [Admitted] = []
        for request in requests {
            switch check(request, index: actions.count, started: started) {
            case .refused(let action):
                actions.append(action)
            case .admitted(let ready):
                admitted.append(ready)
                actions.append(.later)
            }
        }
        if !admitted.isEmpty { queue(admitted, into: &actions, started: started) }
        return actions
    }

    private func check(_ request: HTTPServerRequest, index: Int, started: ContinuousClock.Instant) -> Checked {
        let batch: Bool
        switch request.path {
        case "/v1/messages": batch = false
        case "/v1/messages:batch": batch = true
        default:
            switch request.path.split(separator: "?", maxSplits: 1).first ?? "" {
            case "/v1/messages": batch = false
            case "/v1/messages:batch": batch = true
            default: return refuse(404, "not_found", "POST /v1/messages or /v1/messages:batch", started: started)
            }
        }
        guard request.method == "POST" else {
            return refuse(405, "method_not_allowed", "only POST is accepted here", headers: [("allow", "POST")], started: started)
        }
        if stopping.load(ordering: .relaxed) {
            return refuse(503, "shutting_down", "the worker is shutting down; post again (another instance answers)", retryAfter: 1,
                          then: .goAway, started: started)
        }
        guard Self.isJSON(request.header("content-type")) else {
            return refuse(415, "unsupported_media_type", "the body must be application/json", started: started)
        }
        // Who posts.
        let identity: IngressIdentity
        switch authenticator.authenticate(authorization: request.header("authorization"), appCheck: request.header("x-firebase-appcheck")) {
        case .success(let verified):
            identity = verified
        case .failure(let failure):
            metrics.refusedToken(kind: failure.kind.rawValue, reason: failure.refusal.reason.rawValue)
            logger.debug("refused a \(failure.kind.rawValue) token: \(failure.refusal)")
            return authRefusal(failure, started: started)
        }
        // What is posted.
        let parsed: [Result<IngressMessage, IngressMessage.Invalid>]
        do {
            parsed = try IngressMessage.parse(body: request.body, batch: batch)
        } catch {
            return refuse(error.tooLarge ? 413 : 400, error.tooLarge ? "too_large" : "invalid_message", error.description, started: started)
        }
        if !batch, case .failure(let invalid) = parsed[0] {
            return refuse(invalid.tooLarge ? 413 : 400, invalid.tooLarge ? "too_large" : "invalid_message", invalid.description, started: started)
        }
        var senders: [String?] = []
        senders.reserveCapacity(parsed.count)
        for result in parsed {
            guard case .success(let message) = result else { senders.append(nil); continue }
            guard let sender = Self.sender(identity, token: message.token) else {
                return refuse(400, "invalid_message", "token is required when no verified token names the sender", started: started)
            }
            // An App Check token proves the app, not the install: ids a device could guess
            // would let another install of the app pre-empt them.
            if identity.uid == nil && identity.appID != nil && !Self.isUnguessable(message.messageID) {
                return refuse(400, "invalid_message", "with App Check alone, message_id must be unguessable: a random UUID, or at least "
                              + "22 characters of A-Z a-z 0-9 - _ from a secure random source", started: started)
            }
            senders.append(sender)
        }
        // How fast this sender posts: every message is charged (a batch costs its messages),
        // to the verified user, to the App Check token (one bucket per attestation: a new
        // `token` in the body buys no new bucket), else (no authentication) to the device.
        var counts: [(key: String, count: Int)] = []
        let verifiedKey = Self.rateKey(identity, appCheck: request.header("x-firebase-appcheck"))
        for (result, sender) in zip(parsed, senders) {
            guard case .success = result, let sender else { continue }
            let key = verifiedKey ?? sender
            if let place = counts.firstIndex(where: { $0.key == key }) { counts[place].count += 1 } else { counts.append((key, 1)) }
        }
        for (key, count) in counts {
            if let wait = rateLimit.take(count, for: key) {
                return refuse(429, "rate_limited", "this sender posts faster than \(settings.ratePerSecond)/s (burst \(settings.rateBurst))",
                              headers: [("retry-after", String(wait.components.seconds))], started: started)
            }
        }
        // Whether the pipeline can promise what this mode says.
        if ackMode == .durable && pipeline.isDatabaseDown {
            return refuse(503, "database_unavailable", "the database is unavailable: nothing can be committed now", retryAfter: 5, started: started)
        }
        return prepare(parsed, senders: senders, identity: identity, request: request, index: index, batch: batch, started: started)
    }

    /// The request's messages as the pipeline takes them, each acked (journal and durable
    /// modes) through one `IngressAnswer` for the request.
    private func prepare(_ parsed: [Result<IngressMessage, IngressMessage.Invalid>], senders: [String?], identity: IngressIdentity,
                         request: HTTPServerRequest, index: Int, batch: Bool, started: ContinuousClock.Instant) -> Checked {
        let now = Date()
        var clientIDs: [String] = [], pipelineIDs: [String?] = [], statuses: [String?] = []
        clientIDs.reserveCapacity(parsed.count)
        pipelineIDs.reserveCapacity(parsed.count)
        statuses.reserveCapacity(parsed.count)
        for (result, sender) in zip(parsed, senders) {
            switch result {
            case .failure(let invalid):
                clientIDs.append("?")
                pipelineIDs.append(nil)
                statuses.append("invalid:" + invalid.description)
            case .success(let message):
                clientIDs.append(message.messageID)
                pipelineIDs.append(idPrefix(of: sender!) + message.messageID)
                statuses.append(nil)
            }
        }
        guard statuses.contains(where: { $0 == nil }) else {
            return refuse(400, "invalid_message", "no message of the batch is valid: "
                          + statuses.compactMap { $0.map { String($0.dropFirst(8)) } }.joined(separator: "; "), started: started)
        }
        // Immediate mode answers at once: nothing waits for an ack.
        let answer = ackMode == .immediate ? nil
            : IngressAnswer(reply: request.reply, clientIDs: clientIDs, pipelineIDs: pipelineIDs, statuses: statuses, batch: batch,
                            started: started, metrics: metrics)
        var work: [UpstreamWork] = []
        var records: [UpstreamJournal.Record] = []
        work.reserveCapacity(parsed.count)
        for (result, id) in zip(parsed, pipelineIDs) {
            guard case .success(let message) = result, let id else { continue }
            let upstream: CCSUpstreamMessage
            var ack = CCSAck.sent
            if ackMode == .journal, let answer {
                // Journal mode writes the payload before the answer: made here, once.
                let payload = Self.payload(message, id: id, identity: identity, protocolName: request.protocolName)
                upstream = CCSUpstreamMessage(messageID: id, from: message.token ?? "", category: message.category, dataJSON: message.dataJSON,
                                              json: payload, connection: "https", receivedAt: now)
                let durable = DurableAck(messageID: id, stanza: "", route: answer, tracksDuplicates: false)
                ack = .afterCommit(durable)
                records.append(UpstreamJournal.Record(entry: Spool.Entry(connection: "https", payload: payload,
                                                                         receivedAt: now.timeIntervalSince1970), ack: durable))
            } else {
                // Otherwise only a spool or a dead letter needs it: made then, if ever.
                let protocolName = request.protocolName
                upstream = CCSUpstreamMessage(messageID: id, from: message.token ?? "", category: message.category, dataJSON: message.dataJSON,
                                              connection: "https", receivedAt: now) {
                    Self.payload(message, id: id, identity: identity, protocolName: protocolName)
                }
                if let answer {
                    ack = .afterCommit(DurableAck(messageID: id, stanza: "", route: answer, tracksDuplicates: ackMode == .durable))
                }
            }
            work.append(UpstreamWork(kind: .message(UpstreamMessage(upstream)), ack: ack))
        }
        return .admitted(Admitted(index: index, clientIDs: clientIDs, statuses: statuses, batch: batch, work: work, records: records,
                                  reply: request.reply))
    }

    /// Hands the admitted requests' messages to the pipeline together: all of them, or (a
    /// lane full, or requests waiting already) none, the requests then waiting for room
    /// behind those already waiting (answered 503 when the waiting room is full).
    private func queue(_ admitted: [Admitted], into actions: inout [HTTPServerAction], started: ContinuousClock.Instant) {
        var work: [UpstreamWork]
        var records: [UpstreamJournal.Record] = []
        if admitted.count == 1 {
            work = admitted[0].work
            records = admitted[0].records
        } else {
            work = []
            work.reserveCapacity(admitted.reduce(0) { $0 + $1.work.count })
            for request in admitted { work += request.work }
            if ackMode == .journal { records = admitted.flatMap(\.records) }
        }
        if !waitingRoom.isOccupied && hand(&work, records: records) {
            guard ackMode == .immediate else { return }
            for request in admitted {
                metrics.answered(status: 200, reason: "ok", after: ContinuousClock.now - started)
                actions[request.index] = .respond(Self.accepted(request))
            }
            return
        }
        let group = IngressWaitingRoom.Group(work: work, records: records,
                                             replies: admitted.map { ($0.reply, ackMode == .immediate ? Self.accepted($0) : nil) },
                                             arrived: started)
        guard waitingRoom.enter(group) else { return refuseAsOverloaded(admitted, into: &actions, started: started) }
        // Each answer comes through its reply (`.later`). Room may have come since the offer.
        moveTheWaiting()
    }

    /// Queues `work` as the ack mode says: all of it, or (a lane full) none. In journal
    /// mode room is checked first: once journaled, a message is the pipeline's whatever
    /// happens.
    private func hand(_ work: inout [UpstreamWork], records: [UpstreamJournal.Record]) -> Bool {
        if ackMode == .journal, let journal {
            guard pipeline.hasRoom(for: work) else { return false }
            let segment = journal.append(records)
            for index in work.indices { work[index].ack = .afterJournal(segment: segment) }
            _ = pipeline.offer(work, evenIfFull: true)
            return true
        }
        return pipeline.offer(work)
    }

    /// Immediate mode's answer to a request whose messages are queued.
    private static func accepted(_ request: Admitted) -> HTTPServerResponse {
        IngressAnswer.response(clientIDs: request.clientIDs, statuses: request.statuses.map { $0 ?? "accepted" }, batch: request.batch)
    }

    private func refuseAsOverloaded(_ admitted: [Admitted], into actions: inout [HTTPServerAction], started: ContinuousClock.Instant) {
        for request in admitted {
            guard case .refused(let action) = refuse(503, "overloaded", "the worker's queues are full; post again later", retryAfter: 1,
                                                     started: started) else { continue }
            actions[request.index] = action
        }
    }

    /// Whether a `Content-Type` names JSON: `application/json` in any case, alone or followed
    /// by whitespace or its parameters (`; charset=utf-8`), and nothing else
    /// (`application/jsonp` is not JSON).
    static func isJSON(_ contentType: String?) -> Bool {
        guard let contentType else { return false }
        let expected = "application/json".utf8
        var actual = contentType.utf8.makeIterator()
        for byte in expected {
            guard let next = actual.next(), next | (next >= 0x41 && next <= 0x5A ? 0x20 : 0) == byte else { return false }
        }
        guard let after = actual.next() else { return true }
        return after == UInt8(ascii: ";") || after == UInt8(ascii: " ") || after == UInt8(ascii: "\t")
    }

    private func idPrefix(of sender: String) -> String {
        if let known = idPrefixes.withLock({ $0[sender] }) { return known }
        let prefix = IngressMessageID.prefix(sender: sender)
        idPrefixes.withLock { table in
            if table.count >= 100_000 { table.removeAll(keepingCapacity: true) }
            table[sender] = prefix
        }
        return prefix
    }

    /// The sender messages are de-duplicated and ordered by: the device, where one is known.
    /// The verified user and the device's token (`uid:UID/TOKEN`: a user's phone and tablet
    /// may number their messages alike without colliding; `uid:UID/` without a token), else
    /// the verified app and the device's token (`app:APP/TOKEN`), else (no authentication)
    /// the device's token (`token:TOKEN`). `IngressMessageID` hashes it.
    static func sender(_ identity: IngressIdentity, token: String?) -> String? {
        if let uid = identity.uid { return "uid:" + uid + "/" + (token ?? "") }
        if let app = identity.appID { return "app:" + app + "/" + (token ?? "") }
        return token.map { "token:" + $0 }
    }

    /// The rate bucket of a verified request (nil without a verified token: each device's
    /// token then has its own): the user, or the App Check token itself (hashed).
    static func rateKey(_ identity: IngressIdentity, appCheck: String?) -> String? {
        if let uid = identity.uid { return "uid:" + uid }
        if identity.appID != nil, let appCheck { return "app-check:" + SHA256.hex(of: appCheck, digits: 32) }
        return nil
    }

    /// A random UUID (8-4-4-4-12 hex digits, 122 random bits in version 4), or at least 22
    /// characters of the base64url alphabet (132 bits if random): an id nobody else could
    /// choose first. Whether it is random the worker cannot see; a client that makes its ids
    /// guessable lets other installs of its app pre-empt its messages.
    static func isUnguessable(_ id: String) -> Bool {
        let bytes = Array(id.utf8)
        if bytes.count == 36 {
            let dashes = [8, 13, 18, 23]
            var isUUID = true
            for (index, byte) in bytes.enumerated() {
                let hex = (48...57).contains(byte) || (97...102).contains(byte) || (65...70).contains(byte)
                if dashes.contains(index) ? byte != 45 : !hex { isUUID = false; break }
            }
            if isUUID { return true }
        }
        guard bytes.count >= 22 else { return false }
        return bytes.allSatisfy { (48...57).contains($0) || (65...90).contains($0) || (97...122).contains($0) || $0 == 45 || $0 == 95 }
    }

    /// The message as the pipeline, the journal and the spool keep it: CCS's upstream
    /// shape, with who posted it under `ingress`.
    static func payload(_ message: IngressMessage, id: String, identity: IngressIdentity, protocolName: String) -> String {
        // Written directly: through a `JSONValue`, its members sorted and each value boxed,
        // this cost more than the rest of handling the request.
        var text = #"{"message_id":"#
        // Room for all of it at once (the member names and quotes take under 128 bytes).
        text.reserveCapacity(message.dataJSON.utf8.count + id.utf8.count + (message.token?.utf8.count ?? 0) + message.messageID.utf8.count
                             + (message.category?.utf8.count ?? 0) + (identity.uid?.utf8.count ?? 0) + (identity.appID?.utf8.count ?? 0)
                             + protocolName.utf8.count + 128)
        JSONValue.appendQuoted(id, to: &text)
        text += #","from":"#
        JSONValue.appendQuoted(message.token ?? "", to: &text)
        if let category = message.category {
            text += #","category":"#
            JSONValue.appendQuoted(category, to: &text)
        }
        if let ttl = message.timeToLive {
            text += #","time_to_live":"#
            text += String(ttl)
        }
        // Appended piece by piece: a `+` chain builds a temporary string per operator.
        text += #","data":"#
        text += message.dataJSON
        text += #","ingress":{"message_id":"#
        JSONValue.appendQuoted(message.messageID, to: &text)
        text += #","protocol":"#
        JSONValue.appendQuoted(protocolName, to: &text)
        if let uid = identity.uid {
            text += #","uid":"#
            JSONValue.appendQuoted(uid, to: &text)
        }
        if let app = identity.appID {
            text += #","app_id":"#
            JSONValue.appendQuoted(app, to: &text)
        }
        text += "}}"
        return text
    }

    // MARK: - Refusals

    static func refusal(_ status: Int, _ reason: String, _ message: String, retryAfter: Int? = nil) -> HTTPServerResponse {
        let body = JSONValue.object(["error": .object(["code": .number(JSONNumber(status)), "status": .string(reason), "message": .string(message)])])
        var headers: [(name: String, value: String)] = [("content-type", "application/json")]
        if let retryAfter { headers.append(("retry-after", String(retryAfter))) }
        return HTTPServerResponse(status: status, headers: headers, body: Array(body.serialized.utf8))
    }

    /// A refusal with its reason code, counted in the metrics.
    private func refuse(_ status: Int, _ reason: String, _ message: String, retryAfter: Int? = nil, headers: [(name: String, value: String)] = [],
                        then: HTTPServerAction.Afterwards = .keepOpen, started: ContinuousClock.Instant) -> Checked {
        var response = Self.refusal(status, reason, message, retryAfter: retryAfter)
        response.headers += headers
        metrics.answered(status: status, reason: reason, after: ContinuousClock.now - started)
        return .refused(.respond(response, then: then))
    }

    private func authRefusal(_ failure: IngressAuthenticator.Failure, started: ContinuousClock.Instant) -> Checked {
        let reason = failure.refusal.reason.rawValue
        switch failure.refusal.reason {
        case .keysUnavailable:
            return refuse(503, "keys_unavailable", "the signing keys could not be fetched yet", retryAfter: 5, started: started)
        case .wrongAudience, .wrongIssuer:
            return refuse(403, "wrong_project", "the \(failure.kind.rawValue) token is for another project (\(reason))", started: started)
        case .missing:
            // No credentials: a challenge without an error code (RFC 6750 3.1).
            return refuse(401, "unauthenticated", "the \(failure.kind.rawValue) token is missing",
                          headers: [("www-authenticate", #"Bearer realm="fcm-worker""#)], started: started)
        default:
            return refuse(401, "unauthenticated", "the \(failure.kind.rawValue) token was refused: \(reason)",
                          headers: [("www-authenticate", #"Bearer realm="fcm-worker", error="invalid_token", error_description=""# + reason + "\"")],
                          started: started)
        }
    }
}
