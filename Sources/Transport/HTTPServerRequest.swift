import Foundation
import Runtime

/// A request an `HTTPServerConnection` received.
package struct HTTPServerRequest: Sendable {
    package let method: String
    package let path: String
    /// As received, names lower-cased; HTTP/2's pseudo-headers left out.
    package let headerList: [(name: String, value: String)]
    package let body: [UInt8]
    /// `h2` or `http/1.1`.
    package let protocolName: String
    /// Where an answer given later (`HTTPServerAction.later`) goes, from any thread.
    package let reply: HTTPServerReply

    package var bodyText: String { String(decoding: body, as: UTF8.self) }

    /// The headers by name (a name given twice: its last value).
    package var headers: [String: String] {
        var headers: [String: String] = [:]
        for (name, value) in headerList { headers[name] = value }
        return headers
    }

    /// The first value of the header named `name` (lower-case), found without building a
    /// table: a request has a handful, and a table per request cost more than the search.
    package func header(_ name: String) -> String? {
        headerList.first { $0.name == name }?.value
    }
}
