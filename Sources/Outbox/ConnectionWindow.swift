import FCM
import Foundation
import Postgres
import Runtime
import XMPP

/// A connection's window, as metrics show it.
package struct ConnectionWindow: Sendable {
    package let label: String
    package let pending: Int
    package let draining: Bool
}
