import CSystem
import Foundation
import FuzzChecks

// fcm-worker-fuzz TARGET [arguments]
//
// Built by scripts/fuzz with libFuzzer (-sanitize=fuzzer,address -DFUZZING), it fuzzes
// TARGET: the arguments are libFuzzer's (corpus folders, -max_total_time=N, …), and a
// property that does not hold stops it like a crash, with the input saved.
// Built normally, it replays files or folders of inputs through TARGET and reports the
// first that breaks it (what the regression tests do).

let arguments = CommandLine.arguments
guard arguments.count >= 2, let target = FuzzTarget(rawValue: arguments[1]) else {
    let names = FuzzTarget.allCases.map(\.rawValue).joined(separator: "|")
    FileHandle.standardError.write(Data("usage: fcm-worker-fuzz \(names) [libFuzzer options | input files and folders]\n".utf8))
    exit(2)
}

#if FUZZING
nonisolated(unsafe) var selected = target

/// libFuzzer's entry: one input.
func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    let bytes = data.map { Array(UnsafeBufferPointer(start: $0, count: size)) } ?? []
    do {
        try selected.check(bytes)
    } catch {
        FileHandle.standardError.write(Data("FINDING (\(selected.rawValue)): \(error)\n".utf8))
        abort()
    }
    return 0
}

// libFuzzer sees the program name and its own options, not the target's name.
var libFuzzerArguments = [arguments[0]] + arguments.dropFirst(2)
var argc = Int32(libFuzzerArguments.count)
var cStrings: [UnsafeMutablePointer<CChar>?] = libFuzzerArguments.map { strdup($0) } + [nil]
let status = cStrings.withUnsafeMutableBufferPointer { buffer -> Int32 in
    var argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? = buffer.baseAddress
    return LLVMFuzzerRunDriver(&argc, &argv) { data, size in fuzzOne(data, size) }
}
exit(status)
#else
var files: [String] = []
for path in arguments.dropFirst(2) {
    var isDirectory: ObjCBool = false
    guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else { continue }
    if isDirectory.boolValue {
        files += ((try? FileManager.default.contentsOfDirectory(atPath: path)) ?? []).sorted().map { path + "/" + $0 }
    } else {
        files.append(path)
    }
}
for file in files {
    guard let data = FileManager.default.contents(atPath: file) else { continue }
    do {
        try target.check(Array(data))
    } catch {
        print("\(file): \(error)")
        exit(1)
    }
}
print("\(target.rawValue): \(files.count) input(s), every property held")
#endif
