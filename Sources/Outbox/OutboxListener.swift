import Postgres
import Runtime

/// LISTENs on `fcm_downstream` on a connection of its own and rings the senders'
/// doorbells on every NOTIFY (an outbox insert), until cancelled. It reconnects with
/// backoff when its connection fails; the senders' periodic sweep covers the gaps.
package struct OutboxListener: Sendable {
    package let target: PostgresConnectionString
    package let connectTimeout: Duration
    package let doorbells: [Doorbell]
    package let logger: Logger
    /// Called each time the listener is (again) in place.
    package let onListening: @Sendable () -> Void

    package func run() async {
        var outage = Backoff.outage()
        while !Task.isCancelled {
            do {
                let connection = try await PostgresConnection.connect(target, timeout: connectTimeout, preparesStatements: false)
                do {
                    try await connection.listen("fcm_downstream")
                    outage.reset()
                    ring()
                    onListening()
                    while !Task.isCancelled {
                        // A long wait: cancelling the task ends it (and breaks the connection).
                        if try await connection.nextNotification(timeout: .seconds(30)) != nil { ring() }
                    }
                } catch {
                    await connection.close()
                    throw error
                }
                await connection.close()
            } catch {
                guard !Task.isCancelled else { return }
                let delay = outage.next()
                logger.debug("outbox LISTEN connection failed (the sweep keeps sending; again in \(delay.formattedSeconds)): \(error)")
                await sleepUnlessCancelled(for: delay)
            }
        }
    }

    private func ring() {
        for doorbell in doorbells { doorbell.ring() }
    }
}
