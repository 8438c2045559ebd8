import Foundation
import Runtime

/// A service-account key file read again whenever it changes (its modification time,
/// size or inode), so that a key rotated by replacing the file is used from the next access
/// token on, without a restart.
public final class ServiceAccountFile: Sendable {
    public let path: String
    private struct Loaded {
        var account: ServiceAccount
        var stamp: [Int]
    }
    private let loaded: BlockingLock<Loaded>

    /// Reads the file.
    /// - Throws: `ServiceAccount.Invalid` saying why it cannot be used.
    public init(path: String) throws(ServiceAccount.Invalid) {
        self.path = path
        let stamp = Self.stamp(path)
        loaded = BlockingLock(Loaded(account: try ServiceAccount(file: path), stamp: stamp))
    }

    /// The account as the file holds it now (read again if it changed).
    /// - Throws: `ServiceAccount.Invalid` when the changed file cannot be used (the old key
    ///   is not used in its place: the operator replaced it for a reason).
    public func current() throws(ServiceAccount.Invalid) -> ServiceAccount {
        let stamp = Self.stamp(path)
        if let account = loaded.withLock({ $0.stamp == stamp ? $0.account : nil }) { return account }
        let account = try ServiceAccount(file: path)
        loaded.withLock { $0 = Loaded(account: account, stamp: stamp) }
        return account
    }

    /// The account last read.
    public var lastRead: ServiceAccount { loaded.withLock { $0.account } }

    /// What changes when the file is replaced or written.
    private static func stamp(_ path: String) -> [Int] {
        var info = stat()
        guard stat(path, &info) == 0 else { return [] }
        return [Int(info.st_ino), Int(info.st_size), Int(info.st_mtim.tv_sec), Int(info.st_mtim.tv_nsec)]
    }
}
