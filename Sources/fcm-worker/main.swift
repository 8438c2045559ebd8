import Foundation
import Handlers
import Worker

// The stock worker: the built-in handlers (`store` by default, `echo`), every command of
// a worker executable, and the simulator, benchmarks and device groups.
var handlers = UpstreamHandlers()
for name in BuiltInHandlers.all.keys.sorted() { handlers.register(name, BuiltInHandlers.all[name]!) }
exit(await WorkerMain.run(handlers: handlers, defaultHandlers: ["store"], commands: [GroupsCommand.command, SendCommand.command, VerifyTokenCommand.command, SimulateCommand.command, BenchCommand.command],
                          program: "fcm-worker"))
