import Foundation
import Transport

/// The id under which a message posted over HTTPS is de-duplicated and handed to handlers:
/// `https:` and 32 hex digits of the SHA-256 of its verified sender, then `:` and the id
/// the device chose. Two senders' messages never share an id, whatever ids they choose (a
/// device cannot suppress or overwrite another's message by reusing its id), and the
/// prefix is the sender's ordering key: one sender's messages keep their order, through a
/// spool or journal replay too, since it is in the id itself.
package enum IngressMessageID {
    static let scheme = "https:"
    /// `https:` and 32 hex digits.
    static let prefixLength = 6 + 32

    /// `https:`, the 32 hex digits of `sender`, and `:`: what each of its messages' ids begins with.
    static func prefix(sender: String) -> String {
        scheme + SHA256.hex(of: sender, digits: 32) + ":"
    }

    /// The sender part of an HTTPS message's id; nil for any other id (CCS's).
    @inline(__always)
    static func senderPrefix(of messageID: String) -> String? {
        guard messageID.utf8.count > prefixLength, messageID.utf8.starts(with: scheme.utf8) else { return nil }
        return String(messageID.utf8.prefix(prefixLength))
    }
}
