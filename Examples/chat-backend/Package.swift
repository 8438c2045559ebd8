// swift-tools-version:6.0
import PackageDescription

// A chat backend built on fcm-worker: its handlers and migrations in a library (so that
// tests import them), a thin executable, and unit and end-to-end tests.
//
// In your own project, depend on fcm-worker by URL or by path. A path dependency's
// identity is its folder's name: `.package(path: "../fcm-worker")` is the package
// "fcm-worker". Here the checkout's folder may have any name, so the name is given.
let package = Package(
    name: "chat-backend",
    platforms: [.macOS(.v15)],
    dependencies: [.package(name: "fcm-worker", path: "../..")],
    targets: [
        .target(
            name: "ChatBackend",
            dependencies: [
                .product(name: "Worker", package: "fcm-worker"),
                .product(name: "Handlers", package: "fcm-worker"),
            ]),
        .executableTarget(
            name: "chat-backend",
            dependencies: ["ChatBackend", .product(name: "Worker", package: "fcm-worker")]),
        .testTarget(
            name: "ChatBackendTests",
            dependencies: [
                "ChatBackend",
                .product(name: "Worker", package: "fcm-worker"),
                .product(name: "WorkerTesting", package: "fcm-worker"),
                // The command-line tests set up schemas with a database connection of their
                // own: engine API that `import Worker` does not show a handler module.
                .product(name: "Postgres", package: "fcm-worker"),
            ]),
    ],
    swiftLanguageModes: [.v6]
)
