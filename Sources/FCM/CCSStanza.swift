import XMPP

/// Framing of CCS JSON in XMPP `<message>` stanzas.
public enum CCSStanza {
    /// The JSON text of a stanza's `<gcm xmlns="google:mobile:data">` child (any prefix),
    /// or nil when the stanza carries none.
    public static func payload(of stanza: XMLElement) -> String? {
        guard stanza.name == "message" else { return nil }
        return stanza.child("gcm", namespace: XMPPNamespace.gcm)?.text
    }

    /// A `<message>` stanza carrying `json`, with `id` as its stanza id when given.
    public static func message(json: String, id: String? = nil) -> String {
        var stanza = "<message"
        stanza.reserveCapacity(json.utf8.count + 64 + (id?.utf8.count ?? 0))
        if let id {
            stanza += " id=\""
            XMLEscaping.appendAttribute(id, to: &stanza)
            stanza += "\""
        }
        stanza += "><gcm xmlns=\"google:mobile:data\">"
        XMLEscaping.appendText(json, to: &stanza)
        stanza += "</gcm></message>"
        return stanza
    }

    /// The ack for an upstream message or receipt: `{"to":…,"message_id":…,"message_type":"ack"}`.
    public static func ack(to: String, messageID: String) -> String {
        var json = "{\"to\":"
        json.reserveCapacity(48 + to.utf8.count + messageID.utf8.count)
        JSONValue.appendQuoted(to, to: &json)
        json += ",\"message_id\":"
        JSONValue.appendQuoted(messageID, to: &json)
        json += ",\"message_type\":\"ack\"}"
        return message(json: json)
    }
}
