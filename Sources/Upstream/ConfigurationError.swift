/// A setting that is missing or invalid: of the worker's own (`WorkerConfiguration`), of an
/// application's command options (`CommandOption`) or handler selection
/// (`UpstreamHandlers.selecting`), or found wrong while running (a transaction pooler behind a
/// URL that prepares statements). `fcm-worker` prints
/// `description` as one line and exits with status 2; retrying cannot help.
public struct ConfigurationError: Error, Equatable, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}
