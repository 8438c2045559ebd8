import FCM
import Foundation
import Runtime

/// A way to send outbox rows to FCM: what the outbox's one claim/settle loop
/// (`OutboxClaimLoop`) asks of each transport (XMPP, legacy HTTP, …). The loop claims the
/// rows of `name` as the transport has room, settles itself the rows that cannot be sent
/// (invalid, expired, to a token FCM refused), and hands the others to `send`; the
/// transport sends them within its own flow control and reports every answer through its
/// `OutboxRecorder` (the row updates and token marks to write back, the due time of each
/// retry). A new transport implements this and changes nothing in the loop.
package protocol DownstreamTransport: Sendable {
    /// The rows' `transport` value this transport sends (`xmpp`, `http`).
    var name: String { get }
    /// Whether the loop checks a row against every rule of FCM before it is sent (a
    /// transport whose client checks its own requests leaves it to that client).
    var validatesRows: Bool { get }
    /// The `message_id` a row is sent with, by which an answer finds its row again.
    func messageID(forRow id: Int64) -> String
    /// A claimed row as a message to send, or why it is settled unsent: a token FCM refused
    /// before, a payload it cannot send, a time to live or retry age that passed. The
    /// default reads the payload as a legacy message (checked against every rule of FCM when
    /// `validatesRows`).
    func prepare(_ row: OutboxStore.ClaimedRow, maximumAge: Duration, now: Date) -> Result<ClaimedMessage, OutboxStore.ClaimedRow.Refusal>
    /// How many rows it could take now: room in its flow control plus a read-ahead, less
    /// what it holds; 0 while it cannot send (no open connection).
    func wantedRows() -> Int
    /// The fewest wanted rows worth a claim query (a claim's fixed cost is that of dozens
    /// of rows).
    var claimThreshold: Int { get }
    /// Whether it can never send again in this process (FCM refused its credentials): the
    /// loop stops claiming, and the rows wait for a worker that can.
    var isStopped: Bool { get }
    /// Called on every turn of the loop, before it decides how much to claim (the XMPP
    /// transport frees there the slots of messages whose answer is late).
    func tick()
    /// Sends `messages` (claimed and checked, in id order). It may return once they are
    /// queued (their answers come later) or once they are answered; the loop claims again
    /// when it returns. Cancelled (a shutdown past its deadline), what is under way is
    /// handed back.
    func send(_ messages: [ClaimedMessage]) async
    /// Runs what sends beside the claim loop (a transport's own senders), until cancelled;
    /// the outbox cancels it after `finish`. Most transports have nothing to run.
    func run() async
    /// Shutdown, after the loop stopped claiming: waits until `deadline` (or an urgent
    /// shutdown) for the answers to what was sent, then hands back what it still holds.
    func finish(until deadline: ContinuousClock.Instant, shutdown: ShutdownSignal) async
}

/// A claimed row with the message it describes, ready for a transport.
package struct ClaimedMessage: Sendable {
    package let row: OutboxStore.ClaimedRow
    /// Its message, to the canonical token if its target was replaced (for the v1 transport,
    /// only its target and time to live).
    package let message: DownstreamMessage
    /// Whether its payload names a `message_id` of its own (which the XMPP transport then
    /// leaves out of the wire form it writes from the payload's text). The parsed payload is
    /// not kept: it is freed where the row was checked, not carried to the connections.
    package let payloadHasMessageID: Bool
    /// Its requests to FCM's v1 API (the v1 transport's `prepare`), empty for the others.
    package var v1Requests: [V1Request] = []

    package init(row: OutboxStore.ClaimedRow, message: DownstreamMessage, payloadHasMessageID: Bool, v1Requests: [V1Request] = []) {
        self.row = row
        self.message = message
        self.payloadHasMessageID = payloadHasMessageID
        self.v1Requests = v1Requests
    }
}

/// One request of a row to FCM's v1 API, its body written when the row was claimed (the
/// message's JSON tree is freed there, not on the connection's thread that sends it).
package struct V1Request: Sendable {
    /// What the row's results are kept under (`FCMV1Message.target`).
    package let target: String
    /// True when the target is a device's token or FID.
    package let targetIsDevice: Bool
    /// `FCMV1Message.wireBody`.
    package let body: [UInt8]

    package init(_ message: FCMV1Message) {
        target = message.target
        targetIsDevice = message.targetIsDevice
        body = message.wireBody
    }
}

extension DownstreamTransport {
    package func run() async {}

    package func prepare(_ row: OutboxStore.ClaimedRow, maximumAge: Duration, now: Date) -> Result<ClaimedMessage, OutboxStore.ClaimedRow.Refusal> {
        row.claimedMessage(id: messageID(forRow: row.id), validating: validatesRows, maximumAge: maximumAge, now: now)
    }
}
