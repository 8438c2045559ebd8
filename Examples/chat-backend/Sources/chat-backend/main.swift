import ChatBackend
import Foundation
import Worker

// `chat-backend run`, `migrate`, `migrate status`, `help`: fcm-worker's commands under this
// name, with the chat settings beside the worker's and the chat migrations beside its own.
exit(await WorkerMain.run(settings: ChatSettings(), options: ChatSettings.options, migrations: [chatMigrations],
                          handlers: chatHandlers))
