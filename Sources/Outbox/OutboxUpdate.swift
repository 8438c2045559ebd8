import Foundation

/// A change to one outbox row's delivery state, as the sender records it. Updates for the
/// same row are merged before they are written, so a burst costs one write per row.
package struct OutboxUpdate: Sendable, Equatable {
    package enum Status: String, Sendable {
        /// Handed back unsent (shutdown): claimable again at once.
        case pending
        /// Written to a connection; the worker's lease keeps it until answered.
        case sent
        case acked
        /// FCM's delivery receipt came.
        case delivered
        case failed
        /// To be sent again at `availableAt`.
        case retry
        /// Its time to live (or the maximum age) passed before it could be sent.
        case expired
    }

    package let rowID: Int64
    package var status: Status
    package var attempts: Int?
    package var sentOn: String?
    package var sentAt: Date?
    package var ackedAt: Date?
    package var deliveredAt: Date?
    package var errorCode: String?
    package var errorDescription: String?
    package var canonicalToken: String?
    /// Each token's outcome so far (legacy HTTP, and a v1 fan-out), as JSON text.
    package var tokenResults: String?
    /// The name FCM's v1 API gave the message (a row with one target).
    package var messageName: String?
    /// When the row may be claimed again; nil once it is final.
    package var availableAt: Date?

    package init(rowID: Int64, status: Status, attempts: Int? = nil, sentOn: String? = nil, sentAt: Date? = nil,
         ackedAt: Date? = nil, deliveredAt: Date? = nil, errorCode: String? = nil, errorDescription: String? = nil,
         canonicalToken: String? = nil, tokenResults: String? = nil, messageName: String? = nil, availableAt: Date? = nil) {
        self.rowID = rowID
        self.status = status
        self.attempts = attempts
        self.sentOn = sentOn
        self.sentAt = sentAt
        self.ackedAt = ackedAt
        self.deliveredAt = deliveredAt
        self.errorCode = errorCode
        self.errorDescription = errorDescription
        self.canonicalToken = canonicalToken
        self.tokenResults = tokenResults
        self.messageName = messageName
        self.availableAt = availableAt
    }

    /// How far along the success path a status is: an update never moves a row back
    /// along it (a receipt read before its ack's update keeps the row delivered).
    private var progress: Int {
        switch status {
        case .sent: 1
        case .acked: 2
        case .delivered: 3
        default: 0
        }
    }

    /// This update followed by `later`, as one.
    package func merged(with later: OutboxUpdate) -> OutboxUpdate {
        var result = self
        result.merge(later)
        return result
    }

    /// Makes this update this one followed by `later` (`merged(with:)` in place, so that an
    /// update kept in a dictionary is not copied out and back).
    package mutating func merge(_ later: OutboxUpdate) {
        if !(progress > 0 && later.progress > 0 && progress > later.progress) {
            status = later.status
            availableAt = later.availableAt
        }
        if let value = later.attempts { attempts = value }
        if let value = later.sentOn { sentOn = value }
        if let value = later.sentAt { sentAt = value }
        if let value = later.ackedAt { ackedAt = value }
        if let value = later.deliveredAt { deliveredAt = value }
        if let value = later.errorCode { errorCode = value }
        if let value = later.errorDescription { errorDescription = value }
        if let value = later.canonicalToken { canonicalToken = value }
        if let value = later.tokenResults { tokenResults = value }
        if let value = later.messageName { messageName = value }
    }
}
