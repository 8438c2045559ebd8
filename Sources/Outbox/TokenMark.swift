/// A token FCM refused (`BAD_REGISTRATION`, `DEVICE_UNREGISTERED`) or replaced (a
/// canonical `registration_id`), for the `device_tokens` table.
package struct TokenMark: Sendable, Equatable {
    package enum State: String, Sendable {
        case invalid, unregistered, replaced
    }

    package let token: String
    package let state: State
    package let canonicalToken: String?
    package let errorCode: String?
}
