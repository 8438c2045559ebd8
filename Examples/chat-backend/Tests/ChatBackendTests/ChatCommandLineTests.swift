import Foundation
import Postgres
import Testing
import Worker

/// The `chat-backend` executable as an operator runs it: fcm-worker's commands under its
/// own name, with the chat settings and migrations.
@Suite struct ChatCommandLineTests {
    /// The built `chat-backend`, next to the test bundle (wherever the build folder is).
    static let executable = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
        .appendingPathComponent("chat-backend").path

    static let launchLock = NSLock()

    /// Runs the executable; returns its exit status, standard output and standard error.
    func run(_ arguments: [String], environment: [String: String] = [:]) throws -> (Int32, String, String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: Self.executable)
        process.arguments = arguments
        process.environment = ["PATH": "/usr/bin:/bin"].merging(environment) { $1 }
        let output = Pipe(), errors = Pipe()
        process.standardOutput = output
        process.standardError = errors
        // One launch at a time: Foundation's Process.run() is not safe to call from several
        // threads at once (it crashed in fcm-worker's own suite).
        try Self.launchLock.withLock { try process.run() }
        let out = output.fileHandleForReading.readDataToEndOfFile()
        let err = errors.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: out, as: UTF8.self), String(decoding: err, as: UTF8.self))
    }

    @Test func helpListsTheChatSettingsAndTheHandlers() throws {
        let (status, help, _) = try run(["help", "run"])
        #expect(status == 0)
        #expect(help.hasPrefix("usage: chat-backend run"))
        #expect(help.contains("--chat-max-length N"))
        #expect(help.contains("[CHAT_MAX_LENGTH]"))
        #expect(help.contains("handlers to run, of: register, join, chat, ping, store"))
        let (_, overview, _) = try run([])
        #expect(overview.contains("migrate"))
    }

    @Test func aBadChatSettingIsOneLineAndStatus2() throws {
        let (status, _, errors) = try run(["run", "--sender-id", "1", "--server-key", "k", "--database-url", "postgresql://x/y",
                                           "--chat-max-length", "0"])
        #expect(status == 2)
        #expect(errors == "chat-backend: invalid chat maximum length 0: expected 1 to 100000\n")
        let (unknown, _, handlerErrors) = try run(["run", "--handlers", "chat,nope"], environment: [
            "FCM_SENDER_ID": "1", "FCM_SERVER_KEY": "k", "DATABASE_URL": "postgresql://x/y"])
        #expect(unknown == 2)
        #expect(handlerErrors.contains("unknown handler nope"))
    }

    @Test func migrateAppliesBothSetsAndStatusListsThem() async throws {
        let base = try ChatEndToEndTests.databaseURL
        let schema = "chat_cli_" + UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "").prefix(12)
        let admin = try await PostgresConnection.connect(base)
        try await admin.execute("CREATE SCHEMA \(schema)")
        let url = base + (base.contains("?") ? "&" : "?") + "options=-csearch_path%3D\(schema)"
        let (before, pending, _) = try run(["migrate", "status", "--database-url", url])
        #expect(before == 0)
        #expect(pending.contains("chat-backend  0002_chat_messages"))
        #expect(pending.contains("pending"))
        let (status, applied, errors) = try run(["migrate", "--database-url", url])
        #expect(status == 0, "\(errors)")
        #expect(applied.contains("0001_upstream"))
        #expect(applied.contains("chat-backend/0001_devices_and_rooms, chat-backend/0002_chat_messages"))
        let (_, after, _) = try run(["migrate", "status", "--database-url", url])
        #expect(!after.contains("pending"))
        let (_, again, _) = try run(["migrate", "--database-url", url])
        #expect(again.hasPrefix("the database is up to date"))
        // A folder that does not exist is an error, not a silent fallback.
        let (missing, _, missingErrors) = try run(["migrate", "--database-url", url, "--migrations-dir", "/nonexistent"])
        #expect(missing == 2)
        #expect(missingErrors.contains("/nonexistent does not exist"))
        _ = try await admin.execute("DROP SCHEMA \(schema) CASCADE")
        await admin.close()
    }

    /// `dead-letters replay` builds the handlers as `run` does: from the chat settings given
    /// by flag or by environment variable (before, it refused the flag and ignored the
    /// variable, and the replayed messages were refused again by the default limit).
    @Test func replayBuildsTheHandlersFromTheSettingsGivenByFlagOrVariable() async throws {
        let base = try ChatEndToEndTests.databaseURL
        let schema = "chat_replay_" + UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "").prefix(12)
        let admin = try await PostgresConnection.connect(base)
        try await admin.execute("CREATE SCHEMA \(schema)")
        let url = base + (base.contains("?") ? "&" : "?") + "options=-csearch_path%3D\(schema)"
        let (migrated, _, migrateErrors) = try run(["migrate", "--database-url", url])
        #expect(migrated == 0, "\(migrateErrors)")
        let database = try await PostgresConnection.connect(url)
        try await database.execute("INSERT INTO devices (token, user_id, platform, registered_at) VALUES ('phone-1', 'ann', 'android', now())")
        let text = String(repeating: "x", count: 1500)
        var letters: [Int64] = []
        for id in ["long-1", "long-2", "long-3"] {
            let payload = #"{"from":"phone-1","category":"com.example.chat","message_id":"\#(id)","data":{"action":"chat","room":"lobby","text":"\#(text)"}}"#
            try await database.execute("INSERT INTO processed_upstream (message_id, outcome) VALUES ($1, 'dead_lettered')", [.text(id)])
            letters += try await database.query("""
                INSERT INTO dead_letters (message_id, from_token, raw_payload, reason, error, attempts, received_at, handler, code)
                VALUES ($1, 'phone-1', $2, 'handler_failed', 'chat: chat text of 1500 characters is over the limit of 1000', 1, now(),
                        'chat', 'text_too_long')
                RETURNING id
                """, [.text(id), .text(payload)]).compactMap { $0.int(0) }
        }
        let (listed, list, _) = try run(["dead-letters", "list", "--database-url", url])
        #expect(listed == 0)
        #expect(list.contains("handler_failed/text_too_long  long-1  handler chat"))

        let (byFlag, flagOutput, flagErrors) = try run(["dead-letters", "replay", "\(letters[0])", "--json", "--database-url", url,
                                                        "--chat-max-length", "2000"])
        #expect(byFlag == 0, "\(flagErrors)")
        #expect(try JSONValue.parse(flagOutput)["replayed"] == [JSONValue(Int(letters[0]))])
        let (byVariable, variableOutput, variableErrors) = try run(["dead-letters", "replay", "\(letters[1])", "--json"],
                                                                   environment: ["DATABASE_URL": url, "CHAT_MAX_LENGTH": "2000"])
        #expect(byVariable == 0, "\(variableErrors)")
        #expect(try JSONValue.parse(variableOutput)["replayed"] == [JSONValue(Int(letters[1]))])
        // Without the setting, the default limit refuses it again.
        let (byDefault, defaultOutput, _) = try run(["dead-letters", "replay", "\(letters[2])", "--json", "--database-url", url])
        #expect(byDefault == 0)
        #expect(try JSONValue.parse(defaultOutput)["dead_lettered_again"] == [JSONValue(Int(letters[2]))])
        let stored = try await database.query("SELECT message_id FROM chat_messages ORDER BY 1").compactMap { $0.string(0) }
        #expect(stored == ["long-1", "long-2"])
        // Every maintenance command takes run's settings, the chat ones included.
        for command in [["status"], ["outbox", "requeue", "--status", "failed"], ["prune", "--older-than", "30d"], ["migrate", "status"]] {
            let (status, _, errors) = try run(command + ["--database-url", url, "--chat-max-length", "2000", "--sender-id", "1"])
            #expect(status == 0, "\(command): \(errors)")
        }
        await database.close()
        _ = try await admin.execute("DROP SCHEMA \(schema) CASCADE")
        await admin.close()
    }
}
