import FCM
import Foundation
import Postgres
import Runtime
import Simulator
import Synchronization
import Transport
import Worker

/// An application's handlers end to end, in-process: a simulated CCS and legacy HTTP API
/// over real TLS on loopback, and a worker running the handlers against a real PostgreSQL
/// database (in a schema of its own, migrated with the worker's and the application's
/// migrations). Tests send upstream messages as devices would and await what happened,
/// without polling:
///
/// ```swift
/// let fixture = try await WorkerFixture.start(handlers: app.handlers, migrations: [app.migrations],
///                                             databaseURL: ProcessInfo.processInfo.environment["DATABASE_URL"]!)
/// let id = fixture.sendUpstream(from: "phone-1", data: ["action": "ping"])
/// try await fixture.committed(id)
/// let replies = try await fixture.downstream(to: "phone-1")
/// try await fixture.stop()
/// ```
public final class WorkerFixture: Sendable {
    /// The simulated CCS: inject raw stanzas, drop or drain connections, read its events.
    public let simulator: CCSSimulator
    /// The simulated legacy HTTP API (multicast, device groups): its `requests`.
    public let http: FCMHTTPSimulator
    /// The simulated FCM HTTP v1 API and its token endpoint, whose service account the
    /// worker sends rows with transport `v1` with: script its answers, read its counters.
    public let v1: FCMV1Simulator
    /// The settings the worker runs with.
    public let configuration: WorkerConfiguration
    /// The database URL of the fixture's schema (for your own queries).
    public let databaseURL: String
    /// The category `sendUpstream` gives a message when the call names none: the one given
    /// to `start`, or else the first category the handlers are routed by
    /// (`.category("…")`), or else `com.example.app`.
    public let category: String
    /// Whether `stop()` lets protocol violations the simulated CCS recorded pass.
    private let allowsProtocolViolations: Bool
    private let schema: String?
    private let baseURL: String
    private let worker: FCMWorker
    private let task: Task<Void, any Error>
    private let events: FixtureEvents
    private let files: [String]

    /// Starts the simulators and a worker running `handlers`, and returns once the worker is
    /// connected and its outbox listens.
    ///
    /// - Parameters:
    ///   - databaseURL: a PostgreSQL database the tests may create schemas in.
    ///   - isolated: run in a new schema of that database, dropped by `stop()` (true), or
    ///     in the database as it is (false).
    ///   - category: the category of messages sent without one (see `category`).
    ///   - answer: how the simulated CCS answers each downstream message (default: ack).
    ///   - allowsProtocolViolations: true for a test that makes the worker break CCS's rules
    ///     on purpose; otherwise `stop()` fails on any violation the simulator recorded.
    ///   - configure: changes to the worker's settings (connections, ack mode, …).
    /// - Throws: what starting the simulators, creating the schema or starting the worker threw.
    public static func start(handlers: UpstreamHandlers, migrations: [MigrationSet] = [], databaseURL: String,
                             isolated: Bool = true, category: String? = nil,
                             answer: @escaping @Sendable (DownstreamRequest) -> DownstreamResponse = { _ in .ack() },
                             allowsProtocolViolations: Bool = false,
                             configure: (inout WorkerConfiguration) -> Void = { _ in },
                             logLevel: Logger.Level = .warning) async throws -> WorkerFixture {
        let events = FixtureEvents()
        let authority = try CertificateAuthority(commonName: "fcm-worker fixture CA")
        let identity = try authority.issueServerIdentity()
        let senderID = "123456789012"
        let serverKey = "fixture-" + UUID().uuidString.lowercased()
        var simulatorSettings = SimulatorConfiguration(senderID: senderID, serverKey: serverKey, identity: identity)
        simulatorSettings.responder = { request in
            events.record(request)
            return answer(request)
        }
        let simulator = try CCSSimulator(configuration: simulatorSettings)
        let http: FCMHTTPSimulator
        let v1: FCMV1Simulator
        do {
            http = try FCMHTTPSimulator(senderID: senderID, serverKey: serverKey, identity: identity,
                                        onAnswer: { request, _ in events.record(request) })
        } catch {
            simulator.stop()
            throw error
        }
        do {
            var v1Settings = FCMV1Simulator.Settings()
            v1Settings.onDelivery = { events.record($0) }
            v1 = try FCMV1Simulator(identity: identity, settings: v1Settings)
        } catch {
            simulator.stop()
            http.stop()
            throw error
        }
        let caFile = FileManager.default.temporaryDirectory.appendingPathComponent("fixture-ca-\(UUID()).pem").path
        let accountFile = FileManager.default.temporaryDirectory.appendingPathComponent("fixture-account-\(UUID()).json").path
        let spoolFile = FileManager.default.temporaryDirectory.appendingPathComponent("fixture-\(UUID()).spool").path
        var schema: String?
        var url = databaseURL
        do {
            try authority.rootCertificatePEM.write(toFile: caFile, atomically: true, encoding: .utf8)
            try v1.account.keyFileJSON.write(toFile: accountFile, atomically: true, encoding: .utf8)
            if isolated {
                let name = "fixture_" + UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "").prefix(16)
                let admin = try await PostgresConnection.connect(databaseURL)
                do {
                    try await admin.execute("CREATE SCHEMA \(name)")
                } catch {
                    await admin.close()
                    throw error
                }
                await admin.close()
                schema = String(name)
                url = Self.url(databaseURL, searchPath: String(name))
            }
        } catch {
            simulator.stop()
            http.stop()
            v1.stop()
            throw error
        }
        var configuration = WorkerConfiguration(senderID: senderID, serverKey: serverKey)
        configuration.host = "127.0.0.1"
        configuration.port = simulator.port
        configuration.httpEndpoint = "127.0.0.1:\(http.port)"
        configuration.v1Endpoint = "127.0.0.1:\(v1.port)"
        configuration.serviceAccountFile = accountFile
        configuration.caFile = caFile
        configuration.databaseURL = url
        configuration.migrate = true
        configuration.migrationSets = migrations
        configuration.spoolFile = spoolFile
        configuration.shutdownTimeout = .seconds(5)
        configuration.ioNiceness = nil
        configure(&configuration)
        let worker = FCMWorker(configuration: configuration, handlers: handlers,
                               logger: Logger(label: "fixture worker", minimumLevel: logLevel),
                               observer: { events.record($0) })
        let task = Task { try await worker.run() }
        let fixture = WorkerFixture(simulator: simulator, http: http, v1: v1, configuration: configuration, databaseURL: url,
                                    category: category ?? handlers.categories.first ?? "com.example.app",
                                    allowsProtocolViolations: allowsProtocolViolations, schema: schema,
                                    baseURL: databaseURL, worker: worker, task: task, events: events, files: [caFile, spoolFile, accountFile])
        do {
            try await events.wait(for: "the worker to connect and its outbox to listen", timeout: .seconds(30), failing: task) {
                $0.connected && $0.outboxListening
            }
        } catch {
            try? await fixture.stop()
            throw error
        }
        return fixture
    }

    private init(simulator: CCSSimulator, http: FCMHTTPSimulator, v1: FCMV1Simulator, configuration: WorkerConfiguration, databaseURL: String,
                 category: String, allowsProtocolViolations: Bool, schema: String?, baseURL: String, worker: FCMWorker,
                 task: Task<Void, any Error>, events: FixtureEvents, files: [String]) {
        self.simulator = simulator
        self.http = http
        self.v1 = v1
        self.configuration = configuration
        self.databaseURL = databaseURL
        self.category = category
        self.allowsProtocolViolations = allowsProtocolViolations
        self.schema = schema
        self.baseURL = baseURL
        self.worker = worker
        self.task = task
        self.events = events
        self.files = files
    }

    /// `url` with its sessions' search path set to `schema`.
    static func url(_ url: String, searchPath schema: String) -> String {
        if url.contains("://") {
            return url + (url.contains("?") ? "&" : "?") + "options=-csearch_path%3D\(schema)"
        }
        return url + " options='-csearch_path=\(schema)'"
    }

    // MARK: Sending as a device

    /// Sends an upstream message as the device `from` would, in `category` (nil: the
    /// fixture's `category`, the one its handlers are routed by); returns its message id
    /// (`up-1`, `up-2`, … unless given).
    @discardableResult
    public func sendUpstream(from token: String, data: [String: JSONValue], category: String? = nil,
                             messageID: String? = nil) -> String {
        simulator.injectUpstream(from: token, category: category ?? self.category, data: data, messageID: messageID)
    }

    /// Sends the upstream messages of JSON Lines text, the format of `fcm-worker simulate
    /// --upstream-file`: one JSON object per line with `data`, and `from`, `category`,
    /// `message_id` or any other member when wanted (a line without `category` gets the
    /// fixture's `category`). Returns their message ids, in order.
    /// - Throws: `SimulatorError` naming the first line that is not a JSON object (nothing
    ///   is sent then).
    @discardableResult
    public func sendUpstream(jsonLines text: String) throws -> [String] {
        try simulator.injectUpstream(jsonLines: text, defaultCategory: category)
    }

    // MARK: Waiting for what happened

    /// Returns once the message's handlers committed (its effects are in the database).
    /// - Throws: `SimulatorError` after `timeout`, or at once when it was dead-lettered
    ///   instead or the worker stopped.
    public func committed(_ messageID: String, timeout: Duration = .seconds(10)) async throws {
        try await events.wait(for: "message \(messageID) to commit", timeout: timeout, failing: task) { state in
            if state.deadLettered.contains(messageID) {
                throw SimulatorError("message \(messageID) was dead-lettered, not handled: see the dead_letters table")
            }
            return state.committed.contains(messageID)
        }
    }

    /// Returns once the message was dead-lettered (refused, or failed every attempt).
    public func deadLettered(_ messageID: String, timeout: Duration = .seconds(10)) async throws {
        try await events.wait(for: "message \(messageID) to be dead-lettered", timeout: timeout, failing: task) { state in
            state.deadLettered.contains(messageID)
        }
    }

    /// Waits until CCS has received at least `count` downstream messages to `token` that
    /// `matching` accepts, and returns every one of those received so far (possibly more
    /// than `count`), in order, each as CCS got it (`json`):
    /// `downstream(to: "phone-1") { $0.json["data"]?["text"] != nil }`.
    public func downstream(to token: String, count: Int = 1, timeout: Duration = .seconds(10),
                           matching: @escaping @Sendable (DownstreamRequest) -> Bool = { _ in true }) async throws -> [DownstreamRequest] {
        let selected: @Sendable (DownstreamRequest) -> Bool = { $0.to == token && matching($0) }
        try await events.wait(for: "\(count) downstream message(s) to \(token)", timeout: timeout, failing: task) { state in
            state.downstream.count(where: selected) >= count
        }
        return events.snapshot.downstream.filter(selected)
    }

    /// Waits until the legacy HTTP API has answered `count` requests that `matching`
    /// accepts (multicast and device-group sends, group operations) and returns those so
    /// far, in order.
    public func httpRequests(count: Int = 1, timeout: Duration = .seconds(10),
                             matching: @escaping @Sendable (FCMHTTPSimulator.Request) -> Bool = { _ in true }) async throws -> [FCMHTTPSimulator.Request] {
        try await events.wait(for: "\(count) legacy HTTP request(s)", timeout: timeout, failing: task) { state in
            state.httpRequests.count(where: matching) >= count
        }
        return events.snapshot.httpRequests.filter(matching)
    }

    /// Waits until FCM's HTTP v1 API (the fixture's v1 simulator, which the worker sends
    /// rows with transport `v1` to, with its service account) has accepted at least `count`
    /// messages to `token` that `matching` accepts, and returns those so far, in order, each
    /// as FCM got it (`message`, the v1 `Message` object):
    /// `v1Deliveries(to: "phone-1") { $0.message["data"]?["text"] != nil }`.
    public func v1Deliveries(to token: String, count: Int = 1, timeout: Duration = .seconds(10),
                             matching: @escaping @Sendable (FCMV1Simulator.Delivery) -> Bool = { _ in true }) async throws
        -> [FCMV1Simulator.Delivery] {
        let selected: @Sendable (FCMV1Simulator.Delivery) -> Bool = { $0.message["token"]?.stringValue == token && matching($0) }
        try await events.wait(for: "\(count) v1 message(s) to \(token)", timeout: timeout, failing: task) { state in
            state.v1Deliveries.count(where: selected) >= count
        }
        return events.snapshot.v1Deliveries.filter(selected)
    }

    /// Every message FCM's v1 API accepted, in order.
    public var allV1Deliveries: [FCMV1Simulator.Delivery] { events.snapshot.v1Deliveries }

    /// Every downstream message CCS received, in order.
    public var allDownstream: [DownstreamRequest] { events.snapshot.downstream }

    /// Runs a query on the fixture's database (a connection of its own).
    public func query(_ sql: String, _ parameters: [PostgresValue] = []) async throws -> [PostgresRow] {
        let connection = try await PostgresConnection.connect(databaseURL)
        do {
            let rows = try await connection.query(sql, parameters)
            await connection.close()
            return rows
        } catch {
            await connection.close()
            throw error
        }
    }

    /// Shuts the worker down gracefully, stops the simulators, drops the schema (when
    /// isolated) and removes the fixture's files.
    /// - Throws: what the worker's `run()` threw, if it failed; otherwise a `SimulatorError`
    ///   listing the protocol violations the simulated CCS recorded (unless the fixture was
    ///   started with `allowsProtocolViolations`).
    public func stop() async throws {
        worker.requestShutdown()
        let outcome = await task.result
        simulator.stop()
        http.stop()
        v1.stop()
        if let schema {
            if let admin = try? await PostgresConnection.connect(baseURL) {
                _ = try? await admin.execute("DROP SCHEMA \(schema) CASCADE")
                await admin.close()
            }
        }
        for file in files { try? FileManager.default.removeItem(atPath: file) }
        try outcome.get()
        let violations = simulator.violations
        if !violations.isEmpty, !allowsProtocolViolations {
            throw SimulatorError("the worker broke CCS's protocol \(violations.count) time(s): "
                                 + violations.prefix(5).map { "\($0)" }.joined(separator: "; "))
        }
    }
}

/// What the fixture saw, with waiters woken on each change.
final class FixtureEvents: Sendable {
    struct State: Sendable {
        var connected = false
        var outboxListening = false
        var committed = Set<String>()
        var deadLettered = Set<String>()
        var downstream: [DownstreamRequest] = []
        var httpRequests: [FCMHTTPSimulator.Request] = []
        var v1Deliveries: [FCMV1Simulator.Delivery] = []
    }

    private struct Waiter {
        let id: UInt64
        let check: @Sendable (State) throws -> Bool
        let continuation: CheckedContinuation<Void, any Error>
    }

    private struct Box {
        var state = State()
        var waiters: [Waiter] = []
        var nextID: UInt64 = 0
        /// Failures that came before their waiter was registered.
        var early: [UInt64: any Error] = [:]
    }

    private let state = BlockingLock(Box())

    var snapshot: State { state.withLock { $0.state } }

    func record(_ event: WorkerEvent) {
        update { state in
            switch event {
            case .connected: state.connected = true
            case .outboxListening: state.outboxListening = true
            case .committed(let handled, _, let deadLettered):
                for (id, _) in handled { state.committed.insert(id) }
                state.deadLettered.formUnion(deadLettered)
            default: break
            }
        }
    }

    func record(_ request: DownstreamRequest) {
        update { $0.downstream.append(request) }
    }

    func record(_ request: FCMHTTPSimulator.Request) {
        update { $0.httpRequests.append(request) }
    }

    func record(_ delivery: FCMV1Simulator.Delivery) {
        update { $0.v1Deliveries.append(delivery) }
    }

    private func update(_ change: (inout State) -> Void) {
        let ready = state.withLock { box -> [(CheckedContinuation<Void, any Error>, (any Error)?)] in
            change(&box.state)
            var ready: [(CheckedContinuation<Void, any Error>, (any Error)?)] = []
            box.waiters.removeAll { waiter in
                do {
                    guard try waiter.check(box.state) else { return false }
                    ready.append((waiter.continuation, nil))
                } catch {
                    ready.append((waiter.continuation, error))
                }
                return true
            }
            return ready
        }
        for (continuation, error) in ready {
            if let error { continuation.resume(throwing: error) } else { continuation.resume() }
        }
    }

    /// Returns once `check` holds (throws what it throws); fails after `timeout` or when
    /// the worker's task ends first.
    func wait(for what: String, timeout: Duration, failing task: Task<Void, any Error>,
              until check: @escaping @Sendable (State) throws -> Bool) async throws {
        let id = state.withLock { box in
            box.nextID += 1
            return box.nextID
        }
        let timer = Task { [weak self] in
            try await Task.sleep(for: timeout)
            self?.fail(id, SimulatorError("timed out after \(timeout.formattedSeconds) waiting for \(what)"))
        }
        let watcher = Task { [weak self] in
            let result = await task.result
            let reason: String
            switch result {
            case .success: reason = "the worker stopped"
            case .failure(let error): reason = "the worker failed: \(error)"
            }
            self?.fail(id, SimulatorError("\(reason) while waiting for \(what)"))
        }
        defer {
            timer.cancel()
            watcher.cancel()
        }
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            let immediate: Result<Bool, any Error> = state.withLock { box in
                if let error = box.early.removeValue(forKey: id) { return .failure(error) }
                do {
                    if try check(box.state) { return .success(true) }
                } catch {
                    return .failure(error)
                }
                box.waiters.append(Waiter(id: id, check: check, continuation: continuation))
                return .success(false)
            }
            switch immediate {
            case .success(true): continuation.resume()
            case .success(false): break
            case .failure(let error): continuation.resume(throwing: error)
            }
        }
    }

    private func fail(_ id: UInt64, _ error: any Error) {
        let waiter = state.withLock { box -> Waiter? in
            guard let index = box.waiters.firstIndex(where: { $0.id == id }) else {
                box.early[id] = error
                return nil
            }
            return box.waiters.remove(at: index)
        }
        waiter?.continuation.resume(throwing: error)
    }
}
