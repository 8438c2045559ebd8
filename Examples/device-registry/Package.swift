// swift-tools-version:6.0
import PackageDescription

// A team's own worker: it depends on fcm-worker by path (in your project, by URL or path)
// and registers its handlers next to the built-in ones.
let package = Package(
    name: "device-registry",
    dependencies: [.package(name: "fcm-worker", path: "../..")],
    targets: [
        .executableTarget(
            name: "device-registry",
            dependencies: [
                .product(name: "Worker", package: "fcm-worker"),
                .product(name: "Handlers", package: "fcm-worker"),
            ]),
    ],
    swiftLanguageModes: [.v6]
)
