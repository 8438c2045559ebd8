import Foundation
import Worker
import XMPP

let usage = """
    fcm-worker: a backend worker for Firebase Cloud Messaging's XMPP connection server (CCS)

    usage:
      fcm-worker run [options]        connect to CCS and ack every upstream message
    \(WorkerConfiguration.usage)
    \(SimulateCommand.usage)
      fcm-worker --help               this text

    Flags win over environment variables. Exit status: 0 after SIGTERM/SIGINT, 2 for a
    missing or invalid setting, 3 when FCM refuses the credentials or the certificate, 1 otherwise.
    """

func printError(_ line: String) {
    FileHandle.standardError.write(Data("fcm-worker: \(line)\n".utf8))
}

func runWorker(_ arguments: [String]) async -> Int32 {
    let configuration: WorkerConfiguration
    do {
        configuration = try WorkerConfiguration.parse(arguments: arguments, environment: ProcessInfo.processInfo.environment)
    } catch {
        printError(error.description)
        return 2
    }
    let worker = FCMWorker(configuration: configuration)
    let task = Task { try await worker.run() }
    let trap = SignalTrap { signal in
        worker.logger.info("received \(signal == SIGTERM ? "SIGTERM" : "SIGINT"), shutting down")
        task.cancel()
    }
    defer { _ = trap }
    do {
        try await task.value
        return 0
    } catch let error as XMPPError where error.isConfigurationError {
        printError("\(error)")
        return 3
    } catch {
        printError("\(error)")
        return 1
    }
}

var arguments = Array(CommandLine.arguments.dropFirst())
let command = arguments.isEmpty ? "--help" : arguments.removeFirst()
let status: Int32
switch command {
case "run": status = await runWorker(arguments)
case "simulate": status = await SimulateCommand.run(arguments)
case "--help", "-h", "help":
    print(usage)
    status = 0
default:
    printError("unknown command \(command) (see fcm-worker --help)")
    status = 2
}
exit(status)
