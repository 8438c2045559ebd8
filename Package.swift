// swift-tools-version:6.0
import PackageDescription

/// The targets are layers; each imports only the ones below it:
///
///     fcm-worker (the command line)
///     Simulator          Handlers   WorkerTesting
///         │                 │            │
///         │              Worker ─────────┘   pipeline, outbox, configuration, lifecycle
///         │            ┌────┴────┐
///         └──────────► FCM     Postgres       CCS protocol and HTTP client │ libpq
///                      │          │
///                     XMPP        │           stanzas, parser, session negotiation
///                      │          │
///                  Transport      │           TCP, TLS, the stream loop, HTTPS
///                      └────┬─────┘
///                        Runtime              threads, locks, queues, backoff, lifecycle
let swiftSettings: [SwiftSetting] = [.enableUpcomingFeature("ExistentialAny")]

let package = Package(
    name: "fcm-worker",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "Worker", targets: ["Worker"]),
        .library(name: "Handlers", targets: ["Handlers"]),
        .library(name: "Runtime", targets: ["Runtime"]),
        .library(name: "Transport", targets: ["Transport"]),
        .library(name: "XMPP", targets: ["XMPP"]),
        .library(name: "FCM", targets: ["FCM"]),
        .library(name: "Postgres", targets: ["Postgres"]),
        .library(name: "Simulator", targets: ["Simulator"]),
        .library(name: "WorkerTesting", targets: ["WorkerTesting"]),
        .executable(name: "fcm-worker", targets: ["fcm-worker"]),
    ],
    targets: [
        .systemLibrary(
            name: "CLibPQ", path: "Sources/CLibPQ", pkgConfig: "libpq",
            providers: [.apt(["libpq-dev"])]),
        .systemLibrary(
            name: "COpenSSL", path: "Sources/COpenSSL", pkgConfig: "openssl",
            providers: [.apt(["libssl-dev"])]),
        .systemLibrary(
            name: "CExpat", path: "Sources/CExpat", pkgConfig: "expat",
            providers: [.apt(["libexpat1-dev"])]),
        .systemLibrary(
            name: "CNGHTTP2", path: "Sources/CNGHTTP2", pkgConfig: "libnghttp2",
            providers: [.apt(["libnghttp2-dev"])]),
        .target(name: "CSystem", path: "Sources/CSystem"),
        .target(name: "Runtime", swiftSettings: swiftSettings),
        .target(name: "Transport", dependencies: ["Runtime", "COpenSSL", "CNGHTTP2", "CSystem"], swiftSettings: swiftSettings),
        .target(name: "XMPP", dependencies: ["Runtime", "Transport", "CExpat"], swiftSettings: swiftSettings),
        .target(name: "FCM", dependencies: ["Runtime", "Transport", "XMPP"], swiftSettings: swiftSettings),
        .target(name: "Postgres", dependencies: ["Runtime", "CLibPQ"], swiftSettings: swiftSettings),
        .target(name: "Outbox", dependencies: ["Runtime", "Transport", "XMPP", "FCM", "Postgres"], swiftSettings: swiftSettings),
        .target(name: "Worker", dependencies: ["Runtime", "Transport", "XMPP", "FCM", "Postgres", "Outbox"], swiftSettings: swiftSettings),
        .target(name: "Handlers", dependencies: ["Worker", "FCM", "Postgres"], swiftSettings: swiftSettings),
        .target(name: "Simulator", dependencies: ["Runtime", "Transport", "XMPP", "FCM", "COpenSSL"], swiftSettings: swiftSettings),
        .target(name: "WorkerTesting", dependencies: ["Worker", "Simulator", "FCM", "Postgres", "Runtime", "Transport"],
                swiftSettings: swiftSettings),
        .executableTarget(name: "fcm-worker", dependencies: ["Worker", "Handlers", "Simulator", "Outbox", "FCM", "Postgres", "XMPP", "Transport",
                                                             "Runtime"], swiftSettings: swiftSettings),
        // The parsers' properties, fuzzed by scripts/fuzz and replayed by FuzzRegressionTests.
        .target(name: "FuzzChecks", dependencies: ["FCM", "Transport", "XMPP", "Worker"], swiftSettings: swiftSettings),
        .executableTarget(name: "fcm-worker-fuzz", dependencies: ["FuzzChecks", "CSystem"], swiftSettings: swiftSettings),
        .testTarget(name: "RuntimeTests", dependencies: ["Runtime"]),
        .testTarget(name: "TransportTests", dependencies: ["Transport", "Runtime"]),
        .testTarget(name: "XMPPTests", dependencies: ["XMPP", "Transport", "Runtime"]),
        .testTarget(name: "FCMTests", dependencies: ["FCM", "XMPP", "Transport", "Runtime"]),
        .testTarget(name: "PostgresTests", dependencies: ["Postgres", "Runtime"]),
        .testTarget(name: "WorkerTests", dependencies: ["Worker", "Outbox", "FCM", "Runtime"]),
        .testTarget(name: "FuzzRegressionTests", dependencies: ["FuzzChecks"]),
        // The Swift blocks of docs/handlers.md and README.md, copied by scripts/extract-doc-snippets:
        // built with the tests so that the docs always compile (the test among them runs too).
        .testTarget(name: "HandlerDocs", dependencies: ["Worker", "Handlers", "WorkerTesting"], path: "Tests/HandlerDocs",
                    swiftSettings: swiftSettings),
        .testTarget(name: "EndToEndTests", dependencies: ["Worker", "Outbox", "Handlers", "Simulator", "WorkerTesting", "Runtime", "Transport", "XMPP",
                                                          "FCM", "Postgres"]),
    ],
    swiftLanguageModes: [.v6]
)
