import FCM
import Foundation
import XMPP

/// What a connection's thread found in a received CCS stanza.
struct InterceptedCCS: Sendable {
    /// The `<gcm>` JSON text, nil for stanzas without one.
    let payload: String?
    /// The decoded message, or why it could not be decoded (nil without payload).
    let decoded: Result<CCSMessage, CCSMessage.DecodingError>?
    /// True when the interceptor already queued the ack.
    let acked: Bool
    /// When the stanza was parsed.
    let receivedAt: Date
}

/// Decodes CCS stanzas on the connection's thread and, in immediate mode, writes the ack
/// of every upstream message there and then (receipts are acked at once in both modes).
/// `CONNECTION_DRAINING` is reported from there too, so that sending stops before
/// anything read after it is answered.
struct CCSAckInterceptor: StanzaInterceptor {
    let ackMode: WorkerConfiguration.AckMode
    /// Called on the connection's thread when CCS announces it is draining the connection.
    var onDraining: (@Sendable () -> Void)?

    func intercept(_ stanza: XMLElement) -> Interception {
        let receivedAt = Date()
        guard stanza.name == "message", stanza.attribute("type") != "error", let payload = CCSStanza.payload(of: stanza) else {
            return Interception(attachment: InterceptedCCS(payload: nil, decoded: nil, acked: false, receivedAt: receivedAt))
        }
        let decoded: Result<CCSMessage, CCSMessage.DecodingError>
        do {
            decoded = .success(try CCSMessage.decode(json: payload))
        } catch {
            decoded = .failure(error)
        }
        var reply: String?
        switch decoded {
        case .success(.upstream(let upstream)) where ackMode == .immediate:
            if let id = upstream.messageID, let from = upstream.from { reply = CCSStanza.ack(to: from, messageID: id) }
        case .success(.receipt(let receipt)):
            if let id = receipt.messageID, let from = receipt.from { reply = CCSStanza.ack(to: from, messageID: id) }
        case .success(.control("CONNECTION_DRAINING")):
            onDraining?()
        default:
            break
        }
        return Interception(reply: reply, attachment: InterceptedCCS(payload: payload, decoded: decoded, acked: reply != nil, receivedAt: receivedAt))
    }
}
