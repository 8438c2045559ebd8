import Foundation
import Postgres
import Runtime

/// CPU time spent by the three parties of a benchmark run: this process (the worker), its
/// reaped child processes (the simulator), and a local PostgreSQL cluster (the postmaster,
/// its live children, and the children it has reaped). Differences of two samples, per
/// message, say where a run's CPU went, which the throughput alone cannot.
struct CPUAccount {
    /// CPU seconds (user + system) so far.
    struct Sample {
        var worker: Double
        var children: Double
        /// Nil when the cluster is not on this machine (or its processes are unreadable).
        var postgres: Double?
    }

    /// The postmaster's process id, found through a backend's parent; nil for a remote server.
    let postmaster: Int32?

    static func locate(databaseURL: String) async -> CPUAccount {
        // The backend's parent is read while the backend lives.
        let parent = try? await PostgresConnection.withConnection(databaseURL, preparesStatements: false) { connection -> Int32? in
            guard let backend = try await connection.query("SELECT pg_backend_pid()").first?.int(0),
                  let fields = Self.statFields(Int32(backend)), fields.count > 2 else { return nil }
            return Int32(fields[2])
        }
        guard let parent, let command = Self.statFields(parent)?.first, command == "(postgres)" || command == "(postmaster)" else {
            return CPUAccount(postmaster: nil)
        }
        return CPUAccount(postmaster: parent)
    }

    /// `liveChild`: a child process still running (a simulator stopped only after the run),
    /// whose time so far counts with the children already reaped.
    func sample(liveChild: Int32? = nil) -> Sample {
        var own = rusage(), reaped = rusage()
        getrusage(RUSAGE_SELF.rawValue, &own)
        getrusage(RUSAGE_CHILDREN.rawValue, &reaped)
        let live = (liveChild.flatMap(Self.statFields).map(Self.ownTicks) ?? 0) / Self.ticksPerSecond
        return Sample(worker: Self.seconds(own), children: Self.seconds(reaped) + live,
                      postgres: postmaster.flatMap(Self.clusterSeconds))
    }

    private static var ticksPerSecond: Double { Double(sysconf(Int32(_SC_CLK_TCK))) }

    /// The CPU spent between two samples, in µs per unit of work (a message, a row, a token).
    struct Spent {
        var worker: Double
        var children: Double
        /// Nil when the cluster's CPU was not measured.
        var postgres: Double?

        init(from start: Sample, to end: Sample, units: Int) {
            func micros(_ seconds: Double) -> Double { seconds / Double(max(units, 1)) * 1_000_000 }
            worker = micros(end.worker - start.worker)
            children = micros(end.children - start.children)
            postgres = start.postgres.flatMap { before in end.postgres.map { micros($0 - before) } }
        }
    }

    /// "worker 15.2 µs, simulator 7.3 µs, PostgreSQL 19.0 µs per message (…)".
    static func describe(from start: Sample, to end: Sample, messages: Int, cores: Int) -> String {
        let spent = Spent(from: start, to: end, units: messages)
        var text = String(format: "CPU per message: worker %.1f µs, simulator %.1f µs", spent.worker, spent.children)
        guard let postgres = spent.postgres else { return text + ", PostgreSQL not measured (not a local cluster)" }
        let total = spent.worker + spent.children + postgres
        text += String(format: ", PostgreSQL %.1f µs; %.1f µs in all, which %d cores could do %.0f times a second",
                       postgres, total, cores, Double(cores) * 1_000_000 / total)
        return text
    }

    private static func seconds(_ usage: rusage) -> Double {
        Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1_000_000
    }

    /// The postmaster's own and reaped children's time, plus every live child's.
    ///
    /// A child reaped between reading the postmaster's total and reading the children
    /// would be counted nowhere (a session that ends right then, which made the first
    /// ceiling of a run read 0.1 µs a row): the postmaster's total is read again after the
    /// children, and the whole reading repeated when it changed.
    private static func clusterSeconds(_ postmaster: Int32) -> Double? {
        // Indexes: the command 0, state 1, ppid 2, … utime 12, stime 13, cutime 14, cstime 15.
        func postmasterTicks() -> (own: Double, reaped: Double)? {
            guard let own = statFields(postmaster), own.count > 15 else { return nil }
            return (ownTicks(own), (Double(own[14]) ?? 0) + (Double(own[15]) ?? 0))
        }
        var total: Double?
        for _ in 0..<10 {
            guard let first = postmasterTicks() else { return nil }
            var ticks = first.own + first.reaped
            let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
            for entry in entries {
                guard let pid = Int32(entry), pid != postmaster, let fields = statFields(pid), fields.count > 13,
                      fields[2] == String(postmaster) else { continue }
                ticks += ownTicks(fields)
            }
            total = ticks / ticksPerSecond
            guard let again = postmasterTicks() else { return nil }
            if again.reaped == first.reaped { break }
        }
        return total
    }

    /// A process's own user and system clock ticks (utime and stime) from `statFields`.
    private static func ownTicks(_ fields: [String]) -> Double {
        fields.count > 13 ? (Double(fields[12]) ?? 0) + (Double(fields[13]) ?? 0) : 0
    }

    /// `/proc/PID/stat` as fields: the command in parentheses first, then state, ppid, …
    private static func statFields(_ pid: Int32) -> [String]? {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let open = text.firstIndex(of: "("), let close = text.lastIndex(of: ")") else { return nil }
        let command = "(" + text[text.index(after: open)..<close] + ")"
        return [command] + text[text.index(after: close)...].split(separator: " ").map(String.init)
    }
}
