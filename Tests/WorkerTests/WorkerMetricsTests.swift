import Foundation
import Outbox
import Testing
@testable import Upstream
@testable import Worker

/// The downstream counters of `/metrics`: every update counts once, under its outcome,
/// however the statuses of a list are mixed.
@Suite struct WorkerMetricsTests {
    private func counted(_ page: String, _ series: String) -> Double? {
        page.split(separator: "\n").first { $0.hasPrefix(series + " ") }.flatMap { Double($0.split(separator: " ").last!) }
    }

    @Test func downstreamUpdatesCountOnceEachUnderTheirOutcomeHoweverMixed() {
        let metrics = WorkerMetrics()
        let statuses: [OutboxUpdate.Status] = [.sent, .sent, .acked, .sent, .acked, .acked, .failed, .acked, .retry, .retry]
        metrics.downstream(statuses.enumerated().map { index, status in
            OutboxUpdate(rowID: Int64(index), status: status, errorCode: status == .failed ? "BAD_REGISTRATION" : nil)
        }, transport: "xmpp")
        metrics.downstream([OutboxUpdate(rowID: 99, status: .acked)], transport: "xmpp")
        metrics.downstream([OutboxUpdate(rowID: 100, status: .delivered)], transport: "http")
        let page = metrics.render()
        #expect(counted(page, #"fcm_worker_downstream_total{transport="xmpp",outcome="sent"}"#) == 3)
        #expect(counted(page, #"fcm_worker_downstream_total{transport="xmpp",outcome="acked"}"#) == 5)
        #expect(counted(page, #"fcm_worker_downstream_total{transport="xmpp",outcome="failed"}"#) == 1)
        #expect(counted(page, #"fcm_worker_downstream_total{transport="xmpp",outcome="retried"}"#) == 2)
        #expect(counted(page, #"fcm_worker_downstream_total{transport="http",outcome="delivered"}"#) == 1)
        #expect(counted(page, #"fcm_worker_downstream_errors_total{transport="xmpp",code="BAD_REGISTRATION"}"#) == 1)
    }
}
