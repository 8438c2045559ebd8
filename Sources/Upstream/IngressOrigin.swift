/// Who posted a message over the HTTPS ingress (`UpstreamMessage.ingress`).
public struct IngressOrigin: Sendable, Equatable {
    /// The `message_id` the device chose (unique per sender).
    public let clientMessageID: String
    /// The Firebase Auth user, with `--ingress-auth id-token` or `both`.
    public let uid: String?
    /// The Firebase app id (`1:…:android:…`), with `--ingress-auth app-check` or `both`.
    public let appID: String?
}
