"""firebase-admin's own token verifiers against the simulator's Firebase tokens, and the
worker's verdicts against firebase-admin's: the worker must accept exactly what
firebase-admin accepts, but for the checks the corpus marks stricter by design (firebase-admin
accepts those tokens, the worker refuses them; docs/ingress.md lists them).

Usage: python3 firebase_admin_tokens.py SIMULATOR_OUT_DIR FCM_WORKER_BINARY

For each token of token-corpus.json (written by `fcm-worker simulate`: good tokens and
expired, not yet valid, wrong aud, wrong iss, unknown kid, alg none, HS256 signed with the
public key, a flipped signature bit, an empty sub, a valid token 10 KB long), it runs
`auth.verify_id_token` or `app_check.verify_token`, pointed at the simulator's key URLs
(the one change to the SDK: the URLs it hard-codes), then `fcm-worker verify-token`.
Exits 1 with the disagreements listed.
"""
import json
import os
import subprocess
import sys
import warnings

warnings.filterwarnings("ignore", category=DeprecationWarning)

out, binary = sys.argv[1], sys.argv[2]
env = dict(line.strip().split("=", 1) for line in open(os.path.join(out, "simulator.env")) if "=" in line)
ca = os.path.join(out, "ca.pem")
os.environ["REQUESTS_CA_BUNDLE"] = ca
os.environ["SSL_CERT_FILE"] = ca

import firebase_admin  # noqa: E402
from firebase_admin import app_check, auth, credentials  # noqa: E402
from firebase_admin import _token_gen  # noqa: E402

project_id = env["FCM_INGRESS_PROJECT_ID"]
# The key URLs firebase-admin hard-codes, pointed at the simulator.
_token_gen.ID_TOKEN_CERT_URI = env["FCM_INGRESS_ID_TOKEN_KEYS_URL"]
app_check._AppCheckService._JWKS_URL = env["FCM_INGRESS_APP_CHECK_KEYS_URL"]

app = firebase_admin.initialize_app(credentials.Certificate(env["GOOGLE_APPLICATION_CREDENTIALS"]), {"projectId": project_id})

corpus = json.load(open(os.path.join(out, "token-corpus.json")))
worker_env = dict(os.environ, **env)
failures = []
for entry in corpus:
    name, kind, token, valid = entry["name"], entry["kind"], entry["token"], entry["valid"]
    # Stricter by design (docs/ingress.md): firebase-admin accepts it, the worker refuses it.
    stricter = entry.get("stricter", False)
    try:
        if kind == "id-token":
            auth.verify_id_token(token, app=app)
        else:
            app_check.verify_token(token, app=app)
        admin_accepts, admin_reason = True, ""
    except Exception as error:  # every refusal firebase-admin raises
        admin_accepts, admin_reason = False, type(error).__name__ + ": " + str(error)[:120]
    result = subprocess.run([binary, "verify-token", "--kind", kind, "-"], input=token, capture_output=True, text=True, env=worker_env)
    worker_accepts = result.returncode == 0
    if stricter:
        ok = admin_accepts and not worker_accepts
    else:
        ok = worker_accepts == admin_accepts and admin_accepts == valid
    line = ("ok   " if ok else "FAIL ") + ("(stricter by design) " if stricter else "")
    print(f"{line}{name}: firebase-admin {'accepts' if admin_accepts else 'refuses (' + admin_reason + ')'}; "
          f"worker {'accepts' if worker_accepts else result.stdout.strip() or result.stderr.strip()}")
    if not ok:
        failures.append(name)

if failures:
    print(f"{len(failures)} disagreement(s): {', '.join(failures)}")
    sys.exit(1)
print(f"the worker accepts exactly what firebase-admin accepts ({len(corpus)} tokens)")
