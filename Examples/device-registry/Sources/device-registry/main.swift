import Foundation
import Handlers
import Worker

// Every message is stored; registrations also go to the devices table.
var handlers = UpstreamHandlers()
handlers.register("store", StoreHandler())
handlers.register("register-device", RegisterDevice(), for: .when { $0.data["action"] == "register" })

// Same commands, settings, signals and exit statuses as `fcm-worker`, under this name.
exit(await WorkerMain.run(handlers: handlers, migrations: [deviceRegistryMigrations]))
