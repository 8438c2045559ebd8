import Benchmarks
import FCM
import Foundation
import Handlers
import Postgres
import Runtime
import Simulator
import Synchronization
import Transport
import Worker
import XMPP

/// CPU per message of a reference run, for ratios within one session.
struct CPUReference {
    let messages: Int
    let persistedPerSecond: Double
    /// Per stored message.
    let spent: CPUAccount.Spent
}
