import FCM
import Foundation
import Transport
import Worker
import XMPP

/// `fcm-worker send`: one message from the command line, straight to FCM (not through the
/// outbox), printing FCM's answer: an operator's first check of credentials and endpoints.
enum SendCommand {
    struct Settings: Sendable {
        var worker = WorkerConfiguration(senderID: "", serverKey: "")
        var token: String?
        var topic: String?
        var condition: String?
        var data: [String: JSONValue] = [:]
        var title: String?
        var body: String?
        var transport = OutgoingMessage.Transport.v1
        var dryRun = false
    }

    /// The run settings `send` uses: credentials, endpoints, trust.
    static let runFlags: Set<String> = ["--sender-id", "--server-key", "--server-key-file", "--endpoint", "--xmpp-domain", "--ca-file",
                                        "--http-endpoint", "--service-account-file", "--v1-endpoint", "--project-id"]

    static let options = OptionTable<Settings>([
        CommandOption("--token", placeholder: "TOKEN", default: "none", help: "send to this registration token (or FID over v1)") { settings, text throws(ConfigurationError) in
            settings.token = text
        },
        CommandOption("--topic", placeholder: "NAME", default: "none", help: "send to this topic") { settings, text throws(ConfigurationError) in
            settings.topic = text.hasPrefix("/topics/") ? String(text.dropFirst("/topics/".count)) : text
        },
        CommandOption("--condition", placeholder: "EXPR", default: "none", help: "send to the topics this condition selects") { settings, text throws(ConfigurationError) in
            settings.condition = text
        },
        CommandOption("--data", placeholder: "KEY=VALUE", default: "none", help: "a data entry (repeat the flag for more)") { settings, text throws(ConfigurationError) in
            guard let equals = text.firstIndex(of: "="), equals > text.startIndex else {
                throw ConfigurationError("--data takes KEY=VALUE")
            }
            settings.data[String(text[..<equals])] = .string(String(text[text.index(after: equals)...]))
        },
        CommandOption("--notification-title", placeholder: "TEXT", default: "none", help: "a notification with this title") { settings, text throws(ConfigurationError) in
            settings.title = text
        },
        CommandOption("--notification-body", placeholder: "TEXT", default: "none", help: "the notification's body") { settings, text throws(ConfigurationError) in
            settings.body = text
        },
        CommandOption("--transport", placeholder: "v1|http|xmpp", default: "v1", help: "the FCM API to send with") { settings, text throws(ConfigurationError) in
            guard let transport = OutgoingMessage.Transport(rawValue: text) else { throw ConfigurationError("--transport takes v1, http or xmpp") }
            settings.transport = transport
        },
        .toggle("--dry-run", help: "ask FCM to check the message without delivering it (validate_only, dry_run)") { $0.dryRun = $1 },
    ] + WorkerConfiguration.options.options.filter { runFlags.contains($0.flag) }.map { $0.lifted(to: \Settings.worker) }) { settings throws(ConfigurationError) in
        let targets = [settings.token, settings.topic, settings.condition].compactMap { $0 }
        guard targets.count == 1 else { throw ConfigurationError("give exactly one of --token, --topic, --condition") }
        if settings.transport != .v1 {
            try WorkerConfiguration.options.finish(&settings.worker)
        } else if settings.worker.serviceAccountFile == nil {
            throw ConfigurationError("v1 needs a service account: pass --service-account-file or set GOOGLE_APPLICATION_CREDENTIALS")
        }
    }

    static let command = WorkerCommand(
        name: "send", synopsis: "--token TOKEN|--topic NAME|--condition EXPR [--data K=V]... [options]",
        summary: "send one message straight to FCM (not through the outbox) and print its answer: a first check of credentials; "
            + "exit status 0 when FCM took it, 1 when it refused it, 3 when it refused the credentials",
        options: options.help) { arguments, context in
            var status: Int32 = 0
            guard let (settings, positional) = context.parse(arguments, with: options, into: Settings(), status: &status) else { return status }
            if let extra = positional.first { return context.fail("send: unexpected argument \(extra)") }
            return await run(settings, context: context)
        }

    /// The message in the outbox's payload shape (for http and xmpp, and translated for v1).
    static func payload(_ settings: Settings) -> JSONValue {
        var payload: [String: JSONValue] = [:]
        if !settings.data.isEmpty { payload["data"] = .object(settings.data) }
        var notification: [String: JSONValue] = [:]
        if let title = settings.title { notification["title"] = .string(title) }
        if let body = settings.body { notification["body"] = .string(body) }
        if !notification.isEmpty { payload["notification"] = .object(notification) }
        if settings.dryRun { payload["dry_run"] = true }
        return .object(payload)
    }

    static func run(_ settings: Settings, context: WorkerCommandContext) async -> Int32 {
        let to = settings.token ?? settings.topic.map { "/topics/\($0)" }
        switch settings.transport {
        case .v1: return await sendV1(settings, to: to, context: context)
        case .http: return await sendHTTP(settings, to: to, context: context)
        case .xmpp: return await sendXMPP(settings, to: to, context: context)
        }
    }

    private static func sendV1(_ settings: Settings, to: String?, context: WorkerCommandContext) async -> Int32 {
        let message: FCMV1Message
        let client: FCMV1Client
        do {
            message = try FCMV1Message.requests(target: to, condition: settings.condition, registrationIDs: nil, payload: payload(settings))[0]
            client = try FCMV1Client(account: try ServiceAccount(file: settings.worker.serviceAccountFile!), settings: settings.worker.v1Client)
        } catch let error as ServiceAccount.Invalid {
            return context.fail("send: \(error)", status: 3)
        } catch {
            return context.fail("send: \(error)")
        }
        do {
            switch try await client.send(message) {
            case .sent(let name):
                print("v1: FCM took it: \(name)")
                return 0
            case .refused(let error):
                print("v1: FCM refused it: \(error)")
                return error.action == .stopSending ? 3 : 1
            }
        } catch .credentials(.refused(let reason)) {
            return context.fail("send: the token endpoint refused the service account's grant: \(reason)", status: 3)
        } catch {
            return context.fail("send: no answer from FCM: \(error)", status: 1)
        }
    }

    private static func sendHTTP(_ settings: Settings, to: String?, context: WorkerCommandContext) async -> Int32 {
        do {
            var message = LegacyHTTPMessage(target: to.map { .to($0) } ?? .condition(settings.condition!))
            message.options = try DownstreamMessage(target: to, condition: settings.condition, payload: payload(settings), messageID: "send")
            let client = try FCMHTTPClient(settings: settings.worker.httpClient)
            let answer = try await client.send(message, retrying: false)
            let results: [LegacyHTTPResponse.Result]
            switch answer {
            case .tokens(_, _, _, _, let list): results = list
            case .plainText(let result): results = [result]
            case .topic(let id, let error): results = [LegacyHTTPResponse.Result(messageID: id.map(String.init), error: error)]
            case .group(let success, let failure, let failed):
                print("http: the device group's members got it: \(success), did not: \(failure) \(failed.joined(separator: " "))")
                return failure == 0 ? 0 : 1
            }
            for result in results {
                if let error = result.error {
                    print("http: FCM refused it: \(error)")
                } else {
                    print("http: FCM took it: \(result.messageID ?? "?")"
                          + (result.canonicalRegistrationID.map { " (canonical registration id \($0))" } ?? ""))
                }
            }
            return results.allSatisfy { $0.error == nil } ? 0 : 1
        } catch let error as FCMHTTPClient.Failure {
            return context.fail("send: \(error)", status: error.isConfigurationError ? 3 : 1)
        } catch {
            return context.fail("send: \(error)")
        }
    }

    private static func sendXMPP(_ settings: Settings, to: String?, context: WorkerCommandContext) async -> Int32 {
        let messageID = "send-\(UUID().uuidString.lowercased())"
        let message: DownstreamMessage
        do {
            message = try DownstreamMessage(target: to, condition: settings.condition, payload: payload(settings), messageID: messageID)
            try message.validate()
        } catch {
            return context.fail("send: \(error)")
        }
        let connection: XMPPConnection<XMLElement>
        do {
            connection = try await XMPPConnection<XMLElement>.connect(settings.worker.xmppClient, label: "send")
        } catch let error as XMPPError {
            return context.fail("send: \(error)", status: error.isConfigurationError ? 3 : 1)
        } catch {
            return context.fail("send: \(error)", status: 1)
        }
        do {
            try await connection.send(serialized: CCSStanza.message(json: message.json.serialized))
            while let stanza = await connection.next() {
                guard let json = CCSStanza.payload(of: stanza), let decoded = try? CCSMessage.decode(json: json) else { continue }
                switch decoded {
                case .ack(messageID, _, let canonical):
                    print("xmpp: CCS acked \(messageID)" + (canonical.map { " (canonical registration id \($0))" } ?? ""))
                    await connection.close()
                    return 0
                case .nack(messageID, _, let error, let description, _):
                    print("xmpp: CCS nacked \(messageID): \(error)" + (description.map { " (\($0))" } ?? ""))
                    await connection.close()
                    return 1
                default:
                    continue
                }
            }
            return context.fail("send: the connection closed before CCS answered: \(await connection.closed())", status: 1)
        } catch {
            await connection.close()
            return context.fail("send: \(error)", status: 1)
        }
    }
}
