import Foundation
import FuzzChecks
import Testing

/// Every input of the fuzzing corpus (`Fuzz/corpus/TARGET`) and every input a fuzzer
/// found (`Fuzz/regressions/TARGET-*`) keeps its target's property.
@Suite struct FuzzRegressionTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("Fuzz")

    static func inputs(for target: FuzzTarget) -> [URL] {
        let corpus = root.appendingPathComponent("corpus/\(target.rawValue)")
        let regressions = root.appendingPathComponent("regressions")
        let inCorpus = (try? FileManager.default.contentsOfDirectory(at: corpus, includingPropertiesForKeys: nil)) ?? []
        let found = ((try? FileManager.default.contentsOfDirectory(at: regressions, includingPropertiesForKeys: nil)) ?? [])
            .filter { $0.lastPathComponent.hasPrefix(target.rawValue + "-") }
        return (inCorpus + found).sorted { $0.path < $1.path }
    }

    @Test(arguments: FuzzTarget.allCases)
    func everyKnownInputKeepsTheProperty(_ target: FuzzTarget) throws {
        let inputs = Self.inputs(for: target)
        #expect(!inputs.isEmpty, "no corpus for \(target.rawValue)")
        for input in inputs {
            #expect(throws: Never.self, "\(input.lastPathComponent)") { try target.check(Array(try Data(contentsOf: input))) }
        }
    }

    @Test func readsAreSplitReproducibly() {
        let bytes = Array("<stream:stream xmlns='jabber:client'>".utf8)
        #expect(FuzzTarget.splits(of: bytes) == FuzzTarget.splits(of: bytes))
        #expect(FuzzTarget.splits(of: bytes).flatMap { Array($0) } == Array(bytes.indices))
        #expect(FuzzTarget.splits(of: bytes).count > 1)
    }
}
