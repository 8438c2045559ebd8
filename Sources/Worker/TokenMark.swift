/// A token FCM refused (`BAD_REGISTRATION`, `DEVICE_UNREGISTERED`) or replaced (a
/// canonical `registration_id`), for the `device_tokens` table.
struct TokenMark: Sendable, Equatable {
    enum State: String, Sendable {
        case invalid, unregistered, replaced
    }

    let token: String
    let state: State
    let canonicalToken: String?
    let errorCode: String?
}
