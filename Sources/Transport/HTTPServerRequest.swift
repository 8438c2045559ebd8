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

    /// The fields of which a request may carry one only, over either protocol: two of them
    /// are two readings of one request (a proxy in front that takes the first, a server
    /// that takes the last, or HTTP/1.1 and HTTP/2 each taking another, disagree on who
    /// posted or what).
    package static let singletonFields = ["host", "content-length", "content-type", "authorization", "x-firebase-appcheck"]

    /// The first of `singletonFields` that `headers` (names lower-cased) hold more than once.
    package static func repeatedSingleton(in headers: [(name: String, value: String)]) -> String? {
        var seen = 0
        for (name, _) in headers {
            // By length first: most fields are none of them, and are passed over without a compare.
            let place: Int
            switch name.utf8.count {
            case 4 where name == "host": place = 0
            case 12 where name == "content-type": place = 2
            case 13 where name == "authorization": place = 3
            case 14 where name == "content-length": place = 1
            case 19 where name == "x-firebase-appcheck": place = 4
            default: continue
            }
            guard seen & (1 << place) == 0 else { return name }
            seen |= 1 << place
        }
        return nil
    }

    /// The first value of the header named `name` (lower-case), found without building a
    /// table: a request has a handful, and a table per request cost more than the search.
    package func header(_ name: String) -> String? {
        headerList.first { $0.name == name }?.value
    }
}
