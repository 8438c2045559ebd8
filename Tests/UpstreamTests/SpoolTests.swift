import Foundation
import Testing
@testable import Upstream

@Suite struct SpoolTests {
    private func temporaryPath() -> String {
        FileManager.default.temporaryDirectory.appendingPathComponent("spool-\(UUID())").path
    }

    private func entries(_ count: Int, from first: Int = 0) -> [Spool.Entry] {
        (first..<(first + count)).map { Spool.Entry(connection: "ccs#1.1", payload: #"{"message_id":"m\#($0)","from":"d"}"#, receivedAt: 1_764_500_000) }
    }

    @Test func recordsAreTheJSONThatJSONDecoderReadsBack() throws {
        let awkward = Spool.Entry(connection: "ccs#1.\u{1}", payload: "{\"a\":\"x\\\"y\"}\n\t\r\u{0}é😀/", receivedAt: 1_764_500_000.123_456)
        let record = try Spool.records([awkward])
        let line = String(decoding: record, as: UTF8.self)
        #expect(line.hasSuffix("\n") && line.split(separator: "\n").count == 1)
        let json = Data(line.dropFirst(9).dropLast().utf8)
        #expect(try JSONDecoder().decode(Spool.Entry.self, from: json) == awkward)
        #expect(Spool.parse(record).entries == [awkward])
    }

    @Test func recordsSurviveAReloadInOrder() throws {
        let spool = Spool(path: temporaryPath())
        try spool.append(entries(3))
        try spool.append(entries(2, from: 3))
        let (loaded, corrupt) = try spool.load()
        #expect(loaded == entries(5))
        #expect(corrupt == 0)
        try spool.remove()
        #expect(try spool.load().entries.isEmpty)
    }

    @Test func tornAndCorruptRecordsAreSetAsideAndTheRestIsKept() throws {
        let path = temporaryPath()
        let spool = Spool(path: path)
        try spool.append(entries(4))
        var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)))
        // Damage the second record's payload (its checksum no longer matches) and tear the
        // last one, as a crash in the middle of a write would.
        let secondLine = bytes.firstIndex(of: 0x0A)! + 1
        bytes[secondLine + 30] = bytes[secondLine + 30] == UInt8(ascii: "x") ? UInt8(ascii: "y") : UInt8(ascii: "x")
        bytes.removeLast(10)
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        let (loaded, corrupt) = try spool.load()
        #expect(loaded == [entries(4)[0], entries(4)[2]])
        #expect(corrupt == 2)
        let setAside = try String(contentsOfFile: path + ".corrupt", encoding: .utf8)
        #expect(setAside.split(separator: "\n").count == 2)
        // The spool keeps only the good records: a second load finds nothing more to set aside.
        let again = try spool.load()
        #expect(again.entries == loaded && again.corruptRecords == 0)
        #expect(try String(contentsOfFile: path + ".corrupt", encoding: .utf8) == setAside)
    }

    @Test func oneProcessPerSpoolAndAnUnwritableFolderIsRefusedAtStart() throws {
        let path = temporaryPath()
        let first = Spool(path: path)
        try first.lock()
        #expect(throws: ConfigurationError.self) { try Spool(path: path).lock() }
        #expect(throws: ConfigurationError.self) { try Spool(path: "/nonexistent-folder/spool").lock() }
    }

    @Test func aLockIsReleasedWithItsSpool() throws {
        let path = temporaryPath()
        do {
            let first = Spool(path: path)
            try first.lock()
        }
        try Spool(path: path).lock()
    }
}
