import Ingress
import Testing
@testable import Upstream

/// The ingress's rules of who a message is from, whose bucket it costs, and what a body may
/// be sent as.
@Suite struct IngressRulesTests {
    @Test func aUsersDevicesAreSendersOfTheirOwn() {
        let user = IngressIdentity(uid: "u1")
        #expect(IngressService.sender(user, token: "phone") != IngressService.sender(user, token: "tablet"))
        #expect(IngressService.sender(user, token: "phone") == IngressService.sender(user, token: "phone"))
        #expect(IngressService.sender(user, token: nil) == "uid:u1/")
        // Another user's device of the same token is another sender.
        #expect(IngressService.sender(IngressIdentity(uid: "u2"), token: "phone") != IngressService.sender(user, token: "phone"))
    }

    @Test func aUsersDevicesShareTheUsersBucketAndAppCheckBucketsAreTheToken() {
        #expect(IngressService.rateKey(IngressIdentity(uid: "u1"), appCheck: nil) == "uid:u1")
        let app = IngressIdentity(appID: "1:2:android:3")
        let first = IngressService.rateKey(app, appCheck: "token-a")
        #expect(first != nil && first == IngressService.rateKey(app, appCheck: "token-a"))
        #expect(first != IngressService.rateKey(app, appCheck: "token-b"))
        #expect(IngressService.rateKey(IngressIdentity(), appCheck: nil) == nil, "unauthenticated: per device token")
    }

    @Test func onlyUnguessableIDsPassWithAppCheckAlone() {
        #expect(IngressService.isUnguessable("3b241101-e2bb-4255-8caf-4136c566a962"))
        #expect(IngressService.isUnguessable("Xf3kP9qL2mN8vB4wZ7yT1c"))
        #expect(!IngressService.isUnguessable("1"))
        #expect(!IngressService.isUnguessable("message-00000000001"))
        #expect(!IngressService.isUnguessable("3b241101-e2bb-4255-8caf-4136c566a96!"))
        #expect(!IngressService.isUnguessable("abc def ghi jkl mno pqr stu"))
    }

    @Test func onlyJSONIsJSON() {
        #expect(IngressService.isJSON("application/json"))
        #expect(IngressService.isJSON("Application/JSON; charset=utf-8"))
        #expect(IngressService.isJSON("application/json ;charset=utf-8"))
        #expect(!IngressService.isJSON("application/jsonp"))
        #expect(!IngressService.isJSON("application/json-patch+json"))
        #expect(!IngressService.isJSON("text/plain"))
        #expect(!IngressService.isJSON(nil))
    }
}
