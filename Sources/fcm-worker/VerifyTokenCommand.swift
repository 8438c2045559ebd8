import FCM
import Foundation
import Ingress
import Runtime
import Transport
import Worker

/// `fcm-worker verify-token`: checks one Firebase token the way the HTTPS ingress does
/// (the same key sets, the same rules) and prints the verdict: an operator's answer to
/// "why is this device refused?", and what the firebase-admin check in `scripts/fidelity`
/// compares with firebase-admin's own verifiers. Exit status 0 accepted, 1 refused.
enum VerifyTokenCommand {
    struct Settings: Sendable {
        var worker = WorkerConfiguration(senderID: "", serverKey: "")
        var kind = FirebaseTokenRules.Kind.idToken
    }

    static let runFlags: Set<String> = ["--ca-file", "--project-id", "--ingress-project-id", "--ingress-project-number",
                                        "--ingress-id-token-keys-url", "--ingress-app-check-keys-url", "--ingress-clock-skew"]

    static let options = OptionTable<Settings>([
        CommandOption("--kind", placeholder: "KIND", default: "id-token", help: "id-token or app-check") { settings, text throws(ConfigurationError) in
            guard let kind = FirebaseTokenRules.Kind(rawValue: text) else { throw ConfigurationError("--kind takes id-token or app-check") }
            settings.kind = kind
        },
    ] + WorkerConfiguration.options.options.filter { runFlags.contains($0.flag) }.map { $0.lifted(to: \Settings.worker) })

    static let command = WorkerCommand(
        name: "verify-token", synopsis: "TOKEN|- [--kind id-token|app-check] [options]",
        summary: "check one Firebase ID or App Check token as the HTTPS ingress would and print the verdict; "
            + "exit status 0 when accepted, 1 when refused (- reads the token from standard input)",
        options: options.help) { arguments, context in
            var status: Int32 = 0
            guard let (settings, positional) = context.parse(arguments, with: options, into: Settings(), status: &status) else { return status }
            guard positional.count == 1 else { return context.fail("verify-token: give one token (or - to read it from standard input)") }
            var token = positional[0]
            if token == "-" {
                token = String(decoding: FileHandle.standardInput.readDataToEndOfFile(), as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
            }
            return await run(token, settings, context: context)
        }

    static func run(_ token: String, _ settings: Settings, context: WorkerCommandContext) async -> Int32 {
        let ingress = settings.worker.ingressSettings
        guard let project = ingress.projectID ?? settings.worker.projectID else {
            return context.fail("verify-token: pass --ingress-project-id (or --project-id)")
        }
        let url = settings.kind == .idToken ? ingress.idTokenKeysURL : ingress.appCheckKeysURL
        let source: FirebaseKeySource
        do {
            source = try FirebaseKeySource(url: url, trust: settings.worker.caFile.map { .caFile($0) } ?? .systemDefault,
                                           logger: Logger(label: "verify-token", minimumLevel: .warning))
            try await source.fetch()
        } catch {
            return context.fail("verify-token: cannot fetch the keys from \(url): \(error)")
        }
        let rules = FirebaseTokenRules(kind: settings.kind, projectID: project, projectNumber: ingress.projectNumber, clockSkew: ingress.clockSkew)
        do {
            let verified = try FirebaseTokenVerifier.verify(token, rules: rules, keys: source.keys, now: Date())
            print("accepted: \(settings.kind.rawValue) for \(verified.subject), valid until \(verified.expiresAt)")
            return 0
        } catch {
            print("refused: \(error)")
            return 1
        }
    }
}
