// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "fcm-worker",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "Worker", targets: ["Worker"]),
        .library(name: "Handlers", targets: ["Handlers"]),
        .library(name: "XMPP", targets: ["XMPP"]),
        .library(name: "FCM", targets: ["FCM"]),
        .library(name: "Postgres", targets: ["Postgres"]),
        .library(name: "Simulator", targets: ["Simulator"]),
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
        .target(name: "CSystem", path: "Sources/CSystem"),
        .target(name: "XMPP", dependencies: ["COpenSSL", "CExpat", "CSystem"]),
        .target(name: "FCM", dependencies: ["XMPP"]),
        .target(name: "Postgres", dependencies: ["CLibPQ", "XMPP"]),
        .target(name: "Simulator", dependencies: ["XMPP", "FCM", "COpenSSL"]),
        .target(name: "Worker", dependencies: ["XMPP", "FCM", "Postgres"]),
        .target(name: "Handlers", dependencies: ["Worker", "FCM", "Postgres"]),
        .executableTarget(name: "fcm-worker", dependencies: ["Worker", "Handlers", "Simulator"]),
        .testTarget(name: "XMPPTests", dependencies: ["XMPP"]),
        .testTarget(name: "PostgresTests", dependencies: ["Postgres"]),
        .testTarget(name: "WorkerTests", dependencies: ["Worker", "FCM"]),
        .testTarget(name: "EndToEndTests", dependencies: ["Worker", "Handlers", "Simulator", "XMPP", "FCM", "Postgres"]),
    ],
    swiftLanguageModes: [.v6]
)
