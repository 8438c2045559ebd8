"""FCM's official Admin SDK for Python (firebase-admin, from PyPI) against the simulator's
HTTP v1 API: what it sends must be accepted, and FCM's answers must reach it as the errors
FCM's would raise.

Usage: python3 firebase_admin_check.py SIMULATOR_OUT_DIR
(the folder `fcm-worker simulate --out` wrote: service-account.json, ca.pem, simulator.env).

Its one change to the SDK: the send URL, whose host the SDK hard-codes
(fcm.googleapis.com), points at the simulator. The service-account file's token_uri names
the simulator's token endpoint, as a file for a proxy would; google-auth signs the JWT and
exchanges it there. Exits 1 with the failed checks listed.
"""
import asyncio
import os
import sys
import warnings

# firebase-admin 7 marks Message.token deprecated in favour of fid: both are checked.
warnings.filterwarnings("ignore", category=DeprecationWarning)

out = sys.argv[1]
env = dict(line.strip().split("=", 1) for line in open(os.path.join(out, "simulator.env")) if "=" in line)
ca = os.path.join(out, "ca.pem")
# requests (the SDK's sync sends, google-auth's grant) and httpx (send_each_async, HTTP/2).
os.environ["REQUESTS_CA_BUNDLE"] = ca
os.environ["SSL_CERT_FILE"] = ca
os.environ["GOOGLE_APPLICATION_CREDENTIALS"] = env["GOOGLE_APPLICATION_CREDENTIALS"]

import firebase_admin  # noqa: E402
from firebase_admin import credentials, messaging  # noqa: E402

endpoint = env["FCM_V1_ENDPOINT"]
messaging._MessagingService.FCM_URL = "https://" + endpoint + "/v1/projects/{0}/messages:send"

app = firebase_admin.initialize_app(credentials.Certificate(env["GOOGLE_APPLICATION_CREDENTIALS"]))
project = app.project_id
failures = []


def check(name, condition, detail=""):
    print(("ok   " if condition else "FAIL ") + name + (": " + str(detail) if detail and not condition else ""))
    if not condition:
        failures.append(name)


def expect_error(name, error_type, message):
    try:
        result = messaging.send(message)
        check(name, False, "sent: " + result)
    except error_type as error:
        check(name, True)
        return error
    except Exception as error:  # noqa: BLE001
        check(name, False, "%s: %s" % (type(error).__name__, error))


name = messaging.send(messaging.Message(token="device-1", data={"k": "v"},
                                        notification=messaging.Notification(title="Hi", body="there"),
                                        android=messaging.AndroidConfig(priority="high", ttl=3600, collapse_key="c"),
                                        apns=messaging.APNSConfig(payload=messaging.APNSPayload(aps=messaging.Aps(badge=3)))))
check("a token message is sent and named", name.startswith("projects/%s/messages/" % project), name)
check("a dry run is validated, not delivered",
      messaging.send(messaging.Message(token="device-2"), dry_run=True) == "projects/%s/messages/fake_message_id" % project)
check("a topic message is sent", messaging.send(messaging.Message(topic="news", data={"a": "b"})).startswith("projects/"))
check("a condition message is sent",
      messaging.send(messaging.Message(condition="'a' in topics && 'b' in topics")).startswith("projects/"))
check("an FID message is sent", messaging.send(messaging.Message(fid="installation-1", data={"k": "v"})).startswith("projects/"))
expect_error("UNREGISTERED raises UnregisteredError", messaging.UnregisteredError,
             messaging.Message(token="unregistered-1"))
expect_error("SENDER_ID_MISMATCH raises SenderIdMismatchError", messaging.SenderIdMismatchError,
             messaging.Message(token="mismatch-1"))
expect_error("a malformed token raises InvalidArgumentError", firebase_admin.exceptions.InvalidArgumentError,
             messaging.Message(token="invalid-1"))
expect_error("THIRD_PARTY_AUTH_ERROR raises ThirdPartyAuthError", messaging.ThirdPartyAuthError,
             messaging.Message(token="apns-refused-1"))
expect_error("QUOTA_EXCEEDED raises QuotaExceededError", messaging.QuotaExceededError,
             messaging.Message(token="quota-1"))
# The project's quota, in Google's shape (RESOURCE_EXHAUSTED, FcmError, QuotaFailure, no Retry-After).
error = expect_error("a project-quota 429 raises QuotaExceededError", messaging.QuotaExceededError,
                     messaging.Message(token="project-quota-1"))
if error is not None:
    details = (error.http_response.json().get("error") or {}).get("details") or []
    check("the project-quota 429 names the project in a QuotaFailure",
          any(d.get("@type", "").endswith("google.rpc.QuotaFailure") and "project" in str(d.get("violations")) for d in details),
          details)
# Apple refuses apns-priority 10 for a data-only (background) message, and FCM passes that on.
expect_error("apns-priority 10 on a data-only message to an Apple token raises InvalidArgumentError",
             firebase_admin.exceptions.InvalidArgumentError,
             messaging.Message(token="ios-1", data={"k": "v"}, apns=messaging.APNSConfig(headers={"apns-priority": "10"})))
check("a high-priority alert to an Apple token is sent",
      messaging.send(messaging.Message(token="ios-2", notification=messaging.Notification(title="Hi"),
                                       apns=messaging.APNSConfig(headers={"apns-priority": "10"}))).startswith("projects/"))
check("a background push to an Apple token at priority 5 is sent",
      messaging.send(messaging.Message(token="ios-3", data={"k": "v"},
                                       apns=messaging.APNSConfig(headers={"apns-priority": "5", "apns-push-type": "background"},
                                                                 payload=messaging.APNSPayload(aps=messaging.Aps(content_available=True)))
                                       )).startswith("projects/"))

batch = messaging.send_each([messaging.Message(token="device-%d" % n, data={"n": str(n)}) for n in range(5)]
                            + [messaging.Message(token="unregistered-2")])
check("send_each: 5 sent, 1 failed", (batch.success_count, batch.failure_count) == (5, 1),
      (batch.success_count, batch.failure_count))


async def send_async():
    return await messaging.send_each_async([messaging.Message(token="async-%d" % n) for n in range(20)], dry_run=False)

batch = asyncio.run(send_async())
check("send_each_async (HTTP/2 through httpx): 20 sent", batch.success_count == 20,
      [r.exception for r in batch.responses if r.exception])

if failures:
    print("%d check(s) failed: %s" % (len(failures), ", ".join(failures)))
    sys.exit(1)
print("firebase-admin %s: every check passed against the simulator" % firebase_admin.__version__)
