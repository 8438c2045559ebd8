import Foundation
import Testing

/// The deploy recipes under `deploy/` agree with the worker.
@Suite struct DeployRecipeTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    static let systemdAnalyze = ["/usr/bin/systemd-analyze", "/bin/systemd-analyze"].first { FileManager.default.isExecutableFile(atPath: $0) }

    @Test(.enabled(if: systemdAnalyze != nil, "systemd-analyze is not installed"))
    func theUnitFilePassesSystemdAnalyzeVerify() async throws {
        var unit = try String(contentsOf: Self.root.appendingPathComponent("deploy/fcm-worker.service"), encoding: .utf8)
        // The binary the unit names is not installed here: verify with the built one, and
        // without the environment file the operator writes.
        unit = unit.replacingOccurrences(of: "/usr/local/bin/fcm-worker", with: try CommandLineTests.executable.path)
            .replacingOccurrences(of: "EnvironmentFile=/etc", with: "EnvironmentFile=-/etc")
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("unit-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("fcm-worker.service").path
        try unit.write(toFile: path, atomically: true, encoding: .utf8)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: Self.systemdAnalyze!)
        process.arguments = ["verify", path]
        let errors = Pipe()
        process.standardError = errors
        process.standardOutput = errors
        try launch(process)
        let output = String(decoding: await readToEnd(errors.fileHandleForReading), as: UTF8.self)
        #expect(await exitStatus(of: process) == 0, "\(output)")
        #expect(!output.contains("fcm-worker.service:"), "\(output)")
    }

    @Test func theRecipesUseTheWorkersSettingsAndExitStatuses() throws {
        let unit = try String(contentsOf: Self.root.appendingPathComponent("deploy/fcm-worker.service"), encoding: .utf8)
        #expect(unit.contains("RestartPreventExitStatus=2 3"))
        #expect(unit.contains("Type=notify"))
        #expect(unit.contains("AmbientCapabilities=CAP_SYS_NICE"))
        let container = try String(contentsOf: Self.root.appendingPathComponent("deploy/Containerfile"), encoding: .utf8)
        // Every FCM_ variable the recipes set is one the worker reads.
        let help = WorkerConfigurationHelp.runOptions
        for recipe in [unit, container] {
            for match in recipe.matches(of: /FCM_[A-Z_]+/) where !help.contains(String(match.output)) {
                Issue.record("\(match.output) is not a setting of fcm-worker run")
            }
        }
        #expect(container.contains("/healthz"))
        #expect(container.contains("USER fcm-worker"))
    }

    /// `deploy/kubernetes/`: each manifest reads, the kustomization lists them, and the
    /// StatefulSet gives each worker its own volume for the spool and journal, a grace
    /// period above the shutdown timeout, probes on `/readyz` and `/healthz`, a named
    /// metrics port, resources, the settings of a ConfigMap (each a setting the worker
    /// reads) and the keys of the Secret; a PodDisruptionBudget selects its pods.
    @Test func theKubernetesManifestsKeepEachWorkersStateAndFitItsSettings() throws {
        let folder = Self.root.appendingPathComponent("deploy/kubernetes")
        var manifests: [String: ManifestYAML] = [:]
        for name in try FileManager.default.contentsOfDirectory(atPath: folder.path) where name.hasSuffix(".yaml") {
            let text = try String(contentsOf: folder.appendingPathComponent(name), encoding: .utf8)
            do { manifests[name] = try ManifestYAML.parse(text) } catch { Issue.record("\(name): \(error)") }
        }
        let kustomization = try #require(manifests["kustomization.yaml"])
        let listed = Set(kustomization["resources"]?.items.compactMap(\.text) ?? [])
        #expect(listed == Set(manifests.keys).subtracting(["kustomization.yaml", "secret.example.yaml"]))
        func manifest(kind: String) throws -> ManifestYAML {
            try #require(manifests.values.first { $0["kind"]?.text == kind }, "no \(kind)")
        }

        let settings = try manifest(kind: "ConfigMap")
        guard case .map(let pairs)? = settings["data"] else { Issue.record("the ConfigMap has no data"); return }
        let environment = Dictionary(uniqueKeysWithValues: pairs.compactMap { pair in pair.value.text.map { (pair.key, $0) } })
        let help = WorkerConfigurationHelp.runOptions
        for key in environment.keys where !help.contains(key) { Issue.record("\(key) is not a setting of fcm-worker run") }
        // The settings parse as the worker parses them (the secret files aside: they exist in the pod).
        let withoutFiles = environment.filter { !$0.key.hasSuffix("_FILE") }
        _ = try WorkerConfiguration.parse(arguments: [], environment: withoutFiles.merging(["FCM_SERVER_KEY": "k", "DATABASE_URL": "postgresql://h/d"]) { $1 })

        let set = try manifest(kind: "StatefulSet")
        let pod = try #require(set[path: "spec.template.spec"])
        let container = try #require(pod["containers"]?.items.first)
        #expect(set[path: "spec.template.metadata.labels"] == set[path: "spec.selector.matchLabels"])
        // The spool's folder is a volume claimed per pod.
        let spoolFolder = try #require(environment["FCM_SPOOL_FILE"].map { URL(fileURLWithPath: $0).deletingLastPathComponent().path })
        let stateMount = try #require(container["volumeMounts"]?.items.first { $0["mountPath"]?.text == spoolFolder },
                                      "nothing is mounted at the spool's folder \(spoolFolder)")
        let claims = set[path: "spec.volumeClaimTemplates"]?.items.compactMap { $0[path: "metadata.name"]?.text } ?? []
        #expect(claims.contains(stateMount["name"]?.text ?? "?"), "the spool's volume is not claimed per pod")
        // SIGKILL comes after the grace period: it must outlast the worker's shutdown.
        let grace = try #require(pod["terminationGracePeriodSeconds"]?.text.flatMap { Int($0) })
        let shutdownTimeout = try #require(environment["FCM_SHUTDOWN_TIMEOUT"].flatMap { Double($0) })
        #expect(Double(grace) >= shutdownTimeout + 10, "terminationGracePeriodSeconds \(grace) against --shutdown-timeout \(shutdownTimeout)")
        // Probes and the metrics port, on the port the worker serves.
        let metricsPort = try #require(environment["FCM_METRICS_ADDRESS"]?.split(separator: ":").last.map(String.init))
        let port = try #require(container["ports"]?.items.first { $0["name"]?.text == "metrics" })
        #expect(port["containerPort"]?.text == metricsPort)
        #expect(container[path: "readinessProbe.httpGet.path"]?.text == "/readyz")
        #expect(container[path: "readinessProbe.httpGet.port"]?.text == "metrics")
        #expect(container[path: "livenessProbe.httpGet.path"]?.text == "/healthz")
        #expect(container[path: "livenessProbe.httpGet.port"]?.text == "metrics")
        #expect(container[path: "resources.requests.cpu"] != nil && container[path: "resources.requests.memory"] != nil)
        #expect(container["envFrom"]?.items.first?[path: "configMapRef.name"]?.text == settings[path: "metadata.name"]?.text)
        // The secret files the settings name are keys of the mounted Secret.
        let secretMount = try #require(container["volumeMounts"]?.items.first { $0["readOnly"]?.text == "true" })
        let secretVolume = try #require(pod["volumes"]?.items.first { $0["name"]?.text == secretMount["name"]?.text })
        let secret = try #require(manifests["secret.example.yaml"])
        #expect(secretVolume[path: "secret.secretName"]?.text == secret[path: "metadata.name"]?.text)
        var secretKeys: Set<String> = []
        if case .map(let pairs)? = secret["stringData"] { secretKeys = Set(pairs.map(\.key)) }
        let mountPath = try #require(secretMount["mountPath"]?.text)
        for (key, value) in environment where value.hasPrefix(mountPath + "/") {
            #expect(secretKeys.contains(String(value.dropFirst(mountPath.count + 1))), "\(key) names \(value), which the Secret lacks")
        }

        let budget = try manifest(kind: "PodDisruptionBudget")
        #expect(budget[path: "spec.selector.matchLabels"] == set[path: "spec.selector.matchLabels"])
        let service = try manifest(kind: "Service")
        #expect(service[path: "spec.clusterIP"]?.text == "None")
        #expect(set[path: "spec.serviceName"]?.text == service[path: "metadata.name"]?.text)
        #expect(service["spec"]?["ports"]?.items.contains { $0["name"]?.text == "metrics" } == true)
    }

    @Test func theManifestReaderReadsWhatTheManifestsUseAndRefusesTheRest() throws {
        let document = try ManifestYAML.parse("""
            # a comment
            a: 1
            b:
              - name: x   # trailing
                port: "9464"
              - plain
            c: ["run", 'x']
            d:
              e: "f: g"
            """)
        #expect(document["a"] == .scalar("1"))
        #expect(document["b"]?.items.first?["port"]?.text == "9464")
        #expect(document["b"]?.items.last == .scalar("plain"))
        #expect(document["c"] == .list([.scalar("run"), .scalar("x")]))
        #expect(document[path: "d.e"]?.text == "f: g")
        #expect(throws: ManifestYAML.Unreadable.self) { try ManifestYAML.parse("a: |\n  text") }
        #expect(throws: ManifestYAML.Unreadable.self) { try ManifestYAML.parse("a: 1\n    b: 2") }
        #expect(throws: ManifestYAML.Unreadable.self) { try ManifestYAML.parse("a: 1\na: 2") }
    }
}

import Worker

/// `run`'s option table, as help prints it.
enum WorkerConfigurationHelp {
    static var runOptions: String { WorkerConfiguration.options.help }
}
