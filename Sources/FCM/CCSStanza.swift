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
        var stanza = ""
        stanza.reserveCapacity(json.utf8.count + 64 + (id?.utf8.count ?? 0))
        appendMessage(json: json, id: id, to: &stanza)
        return stanza
    }

    /// Appends the stanza `message(json:id:)` returns to `output`, without building it
    /// apart first (a batch of stanzas is written as one text).
    public static func appendMessage(json: String, id: String? = nil, to output: inout String) {
        output += "<message"
        if let id {
            output += " id=\""
            XMLEscaping.appendAttribute(id, to: &output)
            output += "\""
        }
        output += "><gcm xmlns=\"google:mobile:data\">"
        XMLEscaping.appendText(json, to: &output)
        output += "</gcm></message>"
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
