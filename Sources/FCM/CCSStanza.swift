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
    ///
    /// Made for every upstream message on the connection's thread. When neither `to` nor
    /// `messageID` needs escaping (in JSON or in XML: FCM's tokens and ids never do) the
    /// stanza is written in one pass into one string; otherwise the JSON is built and then
    /// escaped as element content, which gives the same text for plain values.
    public static func ack(to: String, messageID: String) -> String {
        if let plain = plainAck(to: to, messageID: messageID) { return plain }
        return escapedAck(to: to, messageID: messageID)
    }

    private static let ackHead: StaticString = #"<message><gcm xmlns="google:mobile:data">{"to":""#
    private static let ackMiddle: StaticString = #"","message_id":""#
    private static let ackTail: StaticString = #"","message_type":"ack"}</gcm></message>"#

    /// The ack written in one pass, or nil when `to` or `messageID` holds a byte that JSON or
    /// XML escapes (or any byte outside printable ASCII: the escaping path decides those).
    package static func plainAck(to: String, messageID: String) -> String? {
        var to = to, messageID = messageID
        return to.withUTF8 { to in
            messageID.withUTF8 { messageID -> String? in
                guard isPlain(to), isPlain(messageID) else { return nil }
                let count = ackHead.utf8CodeUnitCount + to.count + ackMiddle.utf8CodeUnitCount + messageID.count
                    + ackTail.utf8CodeUnitCount
                return String(unsafeUninitializedCapacity: count) { output in
                    var offset = 0
                    func put(_ bytes: UnsafeBufferPointer<UInt8>) {
                        guard let base = bytes.baseAddress, !bytes.isEmpty else { return }
                        (output.baseAddress! + offset).update(from: base, count: bytes.count)
                        offset += bytes.count
                    }
                    func put(_ text: StaticString) {
                        put(UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
                    }
                    put(ackHead)
                    put(to)
                    put(ackMiddle)
                    put(messageID)
                    put(ackTail)
                    return offset
                }
            }
        }
    }

    /// True when every byte is printable ASCII that neither a JSON string nor XML element
    /// content escapes.
    private static func isPlain(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        for byte in bytes where byte < 0x20 || byte > 0x7E || byte == 0x22 || byte == 0x5C || byte == 0x26 || byte == 0x3C
            || byte == 0x3E {
            return false
        }
        return true
    }

    /// The ack built as JSON, then escaped as element content.
    package static func escapedAck(to: String, messageID: String) -> String {
        var json = "{\"to\":"
        json.reserveCapacity(48 + to.utf8.count + messageID.utf8.count)
        JSONValue.appendQuoted(to, to: &json)
        json += ",\"message_id\":"
        JSONValue.appendQuoted(messageID, to: &json)
        json += ",\"message_type\":\"ack\"}"
        return message(json: json)
    }
}
