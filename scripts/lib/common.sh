# Shared by scripts/test and scripts/demo: installs what is missing and runs a throwaway
# PostgreSQL 15 cluster owned by an unprivileged OS user. Source it; do not run it.

# Debian packages the project needs to build, test and demo (scripts/test adds pgbouncer).
FCM_APT_PACKAGES=(pkg-config libpq-dev libssl-dev libexpat1-dev libnghttp2-dev postgresql-15 openssl ca-certificates curl)

log() { printf '%s: %s\n' "${FCM_SCRIPT_NAME:-fcm-worker}" "$*" >&2; }
die() { log "error: $*"; exit 1; }

ensure_packages() {
  local missing=()
  for pkg in "${FCM_APT_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
      missing+=("$pkg")
    fi
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    die "missing Debian packages: ${missing[*]}; install them with: sudo apt-get install -y ${missing[*]}"
  fi
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null || die "apt-get update failed"
  # Debian's postgresql-common would create and start a cluster of its own: we only want the binaries.
  mkdir -p /etc/postgresql-common
  [ -f /etc/postgresql-common/createcluster.conf ] || echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.conf
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || die "apt-get install ${missing[*]} failed"
}

pg_bindir() {
  local dir
  for dir in /usr/lib/postgresql/15/bin $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -rV); do
    [ -x "$dir/initdb" ] && { echo "$dir"; return 0; }
  done
  die "no PostgreSQL server binaries (initdb) under /usr/lib/postgresql"
}

# As root, PostgreSQL must run as someone else: an unprivileged system user made once.
FCM_PG_OS_USER=fcmworker-pg
as_pg_user() {
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u "$FCM_PG_OS_USER" -- "$@"
  else
    "$@"
  fi
}

ensure_pg_os_user() {
  [ "$(id -u)" -eq 0 ] || return 0
  id "$FCM_PG_OS_USER" >/dev/null 2>&1 && return 0
  useradd --system --no-create-home --shell /usr/sbin/nologin "$FCM_PG_OS_USER" \
    || die "could not create the OS user $FCM_PG_OS_USER for PostgreSQL"
}

# start_cluster DB_NAME: initdb into a fresh temporary folder, start on a free loopback port,
# create DB_NAME, and export DATABASE_URL, PGHOST, PGPORT, FCM_PG_DIR. stop_cluster undoes it.
start_cluster() {
  local db=$1 bindir port attempt
  bindir=$(pg_bindir)
  ensure_pg_os_user
  FCM_PG_DIR=$(mktemp -d /tmp/fcm-worker-pg.XXXXXX)
  export FCM_PG_DIR
  [ "$(id -u)" -eq 0 ] && chown "$FCM_PG_OS_USER" "$FCM_PG_DIR"
  as_pg_user "$bindir/initdb" -D "$FCM_PG_DIR/data" -U postgres --auth=trust --no-sync \
    -E UTF8 --locale=C >"$FCM_PG_DIR/initdb.log" 2>&1 \
    || { cat "$FCM_PG_DIR/initdb.log" >&2; die "initdb failed"; }
  for attempt in $(seq 1 20); do
    port=$(( 20000 + RANDOM % 40000 ))
    if as_pg_user "$bindir/pg_ctl" -D "$FCM_PG_DIR/data" -l "$FCM_PG_DIR/server.log" -w -t 30 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $FCM_PG_DIR -c fsync=on -c max_connections=400" \
        start >/dev/null 2>&1; then
      export PGHOST=127.0.0.1 PGPORT=$port PGUSER=postgres
      "$bindir/psql" -q -X -h 127.0.0.1 -p "$port" -U postgres -d postgres \
        -c "CREATE DATABASE $db" >/dev/null || die "could not create database $db"
      export DATABASE_URL="postgresql://postgres@127.0.0.1:$port/$db"
      log "PostgreSQL $("$bindir/postgres" --version | awk '{print $3}') on 127.0.0.1:$port (data in $FCM_PG_DIR)"
      return 0
    fi
  done
  cat "$FCM_PG_DIR/server.log" >&2 2>/dev/null
  die "could not start PostgreSQL on a free loopback port"
}

# report_server_problems: prints what the throwaway cluster's server log says went wrong on
# the server's side (a backend that crashed or was killed, and the restart that ends every
# session with it; PANICs; resources), for a run that failed: stop_cluster deletes the log,
# and a client sees such a restart only as "server closed the connection unexpectedly".
report_server_problems() {
  [ -n "${FCM_PG_DIR:-}" ] && [ -f "$FCM_PG_DIR/server.log" ] || return 0
  local problems
  problems=$(grep -E 'PANIC|terminated by signal|was terminated|terminating any other active server processes|all server processes terminated|database system was interrupted|out of memory|could not fork|too many clients' \
    "$FCM_PG_DIR/server.log" | tail -n 40) || true
  if [ -n "$problems" ]; then
    log "the PostgreSQL server log of this run says:"
    printf '%s\n' "$problems" >&2
  else
    log "the PostgreSQL server log of this run shows no crash, restart or resource error"
  fi
}

# start_pgbouncer: Debian's PgBouncer in transaction pooling mode in front of the cluster
# start_cluster started (every database, as the user postgres), on a free loopback port, as
# production puts one between workers and PostgreSQL; exports FCM_TEST_PGBOUNCER_PORT.
# Server connections are handed out in turn (server_round_robin), so that a client's
# consecutive transactions land on different server connections, as on a busy pooler.
# stop_cluster stops it too.
start_pgbouncer() {
  [ -n "${FCM_PG_DIR:-}" ] || die "start_pgbouncer needs start_cluster first"
  command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || die "pgbouncer is not installed"
  local dir="$FCM_PG_DIR/pgbouncer" port attempt bin
  bin=$(command -v pgbouncer 2>/dev/null || echo /usr/sbin/pgbouncer)
  mkdir -p "$dir"
  [ "$(id -u)" -eq 0 ] && chown "$FCM_PG_OS_USER" "$dir"
  for attempt in $(seq 1 20); do
    port=$(( 20000 + RANDOM % 40000 ))
    cat >"$dir/pgbouncer.ini" <<INI
[databases]
* = host=127.0.0.1 port=$PGPORT user=postgres
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = any
pool_mode = transaction
server_round_robin = 1
default_pool_size = 8
max_client_conn = 2000
max_db_connections = 40
server_reset_query =
ignore_startup_parameters = extra_float_digits
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
INI
    [ "$(id -u)" -eq 0 ] && chown "$FCM_PG_OS_USER" "$dir/pgbouncer.ini"
    rm -f "$dir/pgbouncer.pid"
    as_pg_user "$bin" -d -q "$dir/pgbouncer.ini" >/dev/null 2>&1 || continue
    for _ in $(seq 1 50); do
      if "$(pg_bindir)/psql" -q -X -h 127.0.0.1 -p "$port" -U postgres -d postgres -c 'SELECT 1' >/dev/null 2>&1; then
        export FCM_TEST_PGBOUNCER_PORT=$port
        log "PgBouncer $("$bin" --version | awk 'NR==1 {print $2}') (transaction pooling) on 127.0.0.1:$port"
        return 0
      fi
      sleep 0.1
    done
    stop_pgbouncer
  done
  cat "$dir/pgbouncer.log" >&2 2>/dev/null
  die "could not start PgBouncer on a free loopback port"
}

stop_pgbouncer() {
  local pidfile="${FCM_PG_DIR:-}/pgbouncer/pgbouncer.pid"
  [ -f "$pidfile" ] || return 0
  kill "$(cat "$pidfile")" 2>/dev/null || true
  for _ in $(seq 1 50); do [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null || break; sleep 0.1; done
  rm -f "$pidfile"
}

stop_cluster() {
  [ -n "${FCM_PG_DIR:-}" ] && [ -d "$FCM_PG_DIR" ] || return 0
  stop_pgbouncer
  as_pg_user "$(pg_bindir)/pg_ctl" -D "$FCM_PG_DIR/data" -m immediate -w stop >/dev/null 2>&1 || true
  rm -rf "$FCM_PG_DIR"
  FCM_PG_DIR=
}

# Runs the curl example of docs/ingress.md (the sh block after its
# "scripts/ingress-example runs the next block" marker) with SIM (a `fcm-worker simulate
# --out` folder) and PORT (the worker's ingress port) set; prints the answer.
run_ingress_example() {
  local block
  block=$(awk '/scripts\/ingress-example runs the next block/ {found=1; next}
               found && /^```sh/ {inside=1; next}
               inside && /^```/ {exit}
               inside {print}' docs/ingress.md)
  [ -n "$block" ] || die "docs/ingress.md has no curl example after its marker"
  SIM=$1 PORT=$2 bash -c "set -euo pipefail; $block"
}
