import Foundation

/// How the HTTPS ingress runs (`fcm-worker run --ingress-*`; docs/ingress.md).
public struct IngressSettings: Sendable {
    /// Which tokens a device must present.
    public enum Authentication: String, Sendable, CaseIterable {
        /// A Firebase Auth ID token (`Authorization: Bearer`).
        case idToken = "id-token"
        /// A Firebase App Check token (`X-Firebase-AppCheck`).
        case appCheck = "app-check"
        /// Both tokens.
        case both
        /// No token: refused unless the address is loopback or `allowUnauthenticated`.
        case none

        /// The token kinds checked.
        public var kinds: [FirebaseTokenRules.Kind] {
            switch self {
            case .idToken: [.idToken]
            case .appCheck: [.appCheck]
            case .both: [.idToken, .appCheck]
            case .none: []
            }
        }
    }

    /// Google's published Firebase Auth signing certificates.
    public static let googleIDTokenKeysURL = "https://www.googleapis.com/robot/v1/metadata/x509/securetoken@system.gserviceaccount.com"
    /// Google's published App Check JWK set.
    public static let googleAppCheckKeysURL = "https://firebaseappcheck.googleapis.com/v1/jwks"

    /// `HOST:PORT` to listen on.
    public var address: String
    /// PEM certificate chain and key; nil with `plain`.
    public var certificateFile: String?
    public var keyFile: String?
    /// Serve plain HTTP (HTTP/1.1 and h2c with prior knowledge) behind a TLS-terminating
    /// load balancer: said explicitly, never a fallback for a missing certificate.
    public var plain = false
    public var authentication = Authentication.idToken
    /// Allows `authentication: .none` on an address that is not loopback.
    public var allowUnauthenticated = false
    /// The Firebase project tokens must be for.
    public var projectID: String?
    public var projectNumber: String?
    public var idTokenKeysURL = googleIDTokenKeysURL
    public var appCheckKeysURL = googleAppCheckKeysURL
    public var clockSkew: Duration = .seconds(10)
    /// Per-sender token bucket: refill rate and burst (FCM let a device hold 20 pending).
    public var ratePerSecond: Double = 10
    public var rateBurst = 20
    public var maximumConnections = 4096
    public var maximumStreamsPerConnection: UInt32 = 100
    /// A whole batch (100 messages of 4 KB of data, and their JSON) fits.
    public var maximumBodyBytes = 1 << 20
    public var idleTimeout: Duration = .seconds(60)
    public var requestTimeout: Duration = .seconds(10)
    /// How long a request whose messages find the pipeline's lanes full waits for room
    /// before it is answered 503 `overloaded` (zero: at once).
    public var queueWait: Duration = .seconds(2)

    /// The largest request head (HTTP/1.1's start line and fields, HTTP/2's decoded header
    /// list): room for the largest tokens Firebase issues (an ID token with custom claims is
    /// at most about 2 KB, an App Check token under 1 KB), refused with 431 or a reset past it.
    public static let maximumHeadBytes = 16 << 10

    public init(address: String) {
        self.address = address
    }

    /// The host and port of `address`.
    public var hostAndPort: (host: String, port: Int)? {
        guard let colon = address.lastIndex(of: ":"), let port = Int(address[address.index(after: colon)...]), (0...65535).contains(port) else {
            return nil
        }
        var host = String(address[..<colon])
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        return host.isEmpty ? nil : (host, port)
    }

    /// True for 127.0.0.0/8, ::1 and localhost.
    public var isLoopback: Bool {
        guard let host = hostAndPort?.host else { return false }
        return host == "localhost" || host == "::1" || host.hasPrefix("127.")
    }

    /// What is wrong with the settings, or nil.
    public var problem: String? {
        guard hostAndPort != nil else { return "invalid ingress address \(address): expected host:port, such as 0.0.0.0:8443" }
        if plain {
            if certificateFile != nil || keyFile != nil { return "--ingress-plain and --ingress-tls-cert/--ingress-tls-key exclude each other" }
        } else if certificateFile == nil || keyFile == nil {
            return "the ingress needs --ingress-tls-cert and --ingress-tls-key, or --ingress-plain behind a TLS-terminating load balancer"
        }
        if authentication == .none && !isLoopback && !allowUnauthenticated {
            return "--ingress-auth none on \(address), which is not loopback: anyone could post as any device; "
                + "pass --ingress-allow-unauthenticated if a proxy in front authenticates"
        }
        if authentication != .none && (projectID ?? "").isEmpty {
            return "--ingress-auth \(authentication.rawValue) needs the Firebase project: pass --ingress-project-id (or --project-id)"
        }
        if !(0...60).contains(clockSkew.components.seconds) { return "--ingress-clock-skew must be 0 to 60 seconds" }
        if ratePerSecond <= 0 || rateBurst < 1 { return "--ingress-rate and --ingress-burst must be positive" }
        return nil
    }
}
