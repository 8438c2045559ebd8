import Foundation
import Runtime

/// A response an `HTTPServerConnection` sends.
package struct HTTPServerResponse: Sendable {
    package var status: Int
    /// Names lower-case (HTTP/2 requires it).
    package var headers: [(name: String, value: String)]
    package var body: [UInt8]

    package init(status: Int, headers: [(name: String, value: String)] = [], body: [UInt8] = []) {
        self.status = status
        self.headers = headers
        self.body = body
    }
}
