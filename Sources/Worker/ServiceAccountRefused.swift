import FCM

/// The service account cannot be used: its file is unreadable or malformed, or Google's
/// token endpoint refused its grant. `fcm-worker run` exits with status 3 (as for refused
/// CCS credentials): retrying cannot fix it.
public struct ServiceAccountRefused: Error, Sendable, CustomStringConvertible {
    public let description: String

    public init(_ description: String) {
        self.description = description
    }
}
