#!/usr/bin/env bash
# Load test: `allot serve` against an allow-everything baseline server on the same stack
# (benches/baseline_server.rs: axum + axum-server + rustls/ring, ALPN h2 and http/1.1), both on
# 127.0.0.1, driven by h2load with captured AdmissionReviews posted to /mutate or /validate
# (CASES; by default the issue's four: /mutate 010, /validate 011, 002, 019). Results are
# reported as ratios allot/baseline measured in the same run, because the machine is shared and
# noisy: every run is done against the baseline, then against allot, back to back.
#
# Runs, for each server:
#   http/1.1  keep-alive, $H1_CLIENTS connections, for $DURATION s (the production path: the
#             API server uses HTTP/1.1, a connection per concurrent call, for Service webhooks
#             and any URL but a loopback one; HTTP/2 for a loopback URL);
#   h2        $H2_CLIENTS connections x $H2_STREAMS concurrent streams, for $DURATION s;
#   rate      http/1.1 at a fixed $RATE_CLIENTS x $RATE_PER_CLIENT req/s (2,000 by default), for
#             $DURATION s: the latency percentiles that matter.
# Latency percentiles are computed from h2load's --log-file (per-request microseconds). Each
# server's CPU time per request (from /proc) is reported too: h2load shares the 2 cores with the
# server, so req/s is partly the load generator's limit, while CPU per request is the server's.
#
# Targets (issue 13): /validate >= 0.6 and /mutate >= 0.8 of the baseline's HTTP/1.1
# throughput; p99 < 1 ms at 2,000 req/s.
#
# Needs: h2load (Debian/Ubuntu: apt-get install -y nghttp2-client), cargo, awk, sort.
# Installs nothing. Bounded: every run has a duration, every wait a count; only 127.0.0.1 is
# contacted; every process it starts is stopped on exit.
#
# Usage: scripts/load.sh            (env: DURATION=10 H1_CLIENTS=16 H2_CLIENTS=8 H2_STREAMS=10
#                                         RATE_CLIENTS=8 RATE_PER_CLIENT=250 SKIP_BUILD=0
#                                         CASES="mutate:010 validate:011 validate:002 validate:019"
#                                         (PATH:FIXTURE, FIXTURE a file or a number prefix
#                                         in tests/fixtures/admission-reviews/)
#                                         LOAD_RESULTS=FILE (copy of the raw table) KEEP_WORK=1
#                                         RUNS="http1.1 h2 rate" (a subset to run)
#                                         ROUNDS=1 (each case and run repeated, alternated,
#                                         this many times; the targets are judged on the
#                                         median of the rounds' ratios)
#                                         ALLOT_BIN=PATH (another build of allot, e.g. the
#                                         commit before a change, with SKIP_BUILD=1)
#                                         BASELINE_NAGLE=1 (baseline leaves Nagle on: no
#                                         TCP_NODELAY, as allot serve before it set it))

set -euo pipefail

DURATION=${DURATION:-10}
WARMUP=${WARMUP:-1}
H1_CLIENTS=${H1_CLIENTS:-16}
H2_CLIENTS=${H2_CLIENTS:-8}
H2_STREAMS=${H2_STREAMS:-10}
RATE_CLIENTS=${RATE_CLIENTS:-8}
RATE_PER_CLIENT=${RATE_PER_CLIENT:-250}
SKIP_BUILD=${SKIP_BUILD:-0}
RUNS=${RUNS:-http1.1 h2 rate}
BASELINE_NAGLE=${BASELINE_NAGLE:-0}
CASES=${CASES:-mutate:010 validate:011 validate:002 validate:019}
ROUNDS=${ROUNDS:-1}

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
reviews=$repo/tests/fixtures/admission-reviews

if ! command -v h2load >/dev/null 2>&1; then
    echo "load.sh: h2load not found. It comes with nghttp2's client tools:" >&2
    echo "    Debian/Ubuntu: apt-get install -y nghttp2-client" >&2
    echo "    Fedora: dnf install nghttp2    macOS: brew install nghttp2" >&2
    exit 2
fi
for tool in cargo awk sort; do
    command -v "$tool" >/dev/null 2>&1 || { echo "load.sh: $tool not found" >&2; exit 2; }
done
# fixture_of SPEC: the file a case names (a path, or a number prefix in $reviews).
fixture_of() {
    if [[ -f $1 ]]; then
        echo "$1"
        return
    fi
    local match
    match=$(find "$reviews" -maxdepth 1 -name "$1-*.json" | sort | head -n 1)
    [[ -n $match ]] || { echo "load.sh: no fixture $1 (a file, or a prefix in $reviews)" >&2; exit 2; }
    echo "$match"
}
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "load.sh: ROUNDS must be a positive integer, got $ROUNDS" >&2; exit 2; }
for case in $CASES; do
    [[ $case == mutate:* || $case == validate:* ]] || { echo "load.sh: case $case is not mutate:F or validate:F" >&2; exit 2; }
    fixture_of "${case#*:}" >/dev/null
done

work=$(mktemp -d "${TMPDIR:-/tmp}/allot-load.XXXXXX")
pids=()
cleanup() {
    local pid
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    if [[ ${KEEP_WORK:-0} == 1 ]]; then
        echo "load.sh: kept $work"
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- build --------------------------------------------------------------------------------
cd "$repo"
if [[ $SKIP_BUILD != 1 ]]; then
    echo "== building release binaries"
    cargo build --release --bin allot --example baseline-server
fi
target_dir=$(cargo metadata --no-deps --format-version 1 | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
allot_bin=${ALLOT_BIN:-$target_dir/release/allot}
baseline_bin=${BASELINE_BIN:-$target_dir/release/examples/baseline-server}
[[ -x $allot_bin && -x $baseline_bin ]] || { echo "load.sh: binaries not found under $target_dir/release" >&2; exit 2; }

# --- certificates and servers ------------------------------------------------------------
"$allot_bin" certs --out "$work/certs" --dns-name localhost --dns-name 127.0.0.1 >/dev/null

# start NAME OUTFILE CMD...: starts a server in the background and waits (at most 30 s) for its
# "serving webhooks on https://ADDR" line; sets $addr.
start() {
    local name=$1 out=$2
    shift 2
    "$@" >"$out" 2>"$out.err" &
    local pid=$!
    pids+=("$pid")
    started_pid=$pid
    addr=""
    for _ in $(seq 1 300); do
        addr=$(sed -n 's|.*serving webhooks on https://\([0-9.:]*\).*|\1|p' "$out" | head -n 1)
        [[ -n $addr ]] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if [[ -z $addr ]]; then
        echo "load.sh: $name did not start; its output:" >&2
        cat "$out" "$out.err" >&2
        exit 1
    fi
}

start allot "$work/allot.out" "$allot_bin" serve --policies "$repo/policies" \
    --tls-cert "$work/certs/tls.crt" --tls-key "$work/certs/tls.key" \
    --addr 127.0.0.1:0 --metrics-addr 127.0.0.1:0 --no-namespace-watch
allot_addr=$addr
allot_pid=$started_pid
baseline_args=(--tls-cert "$work/certs/tls.crt" --tls-key "$work/certs/tls.key" --addr 127.0.0.1:0)
[[ $BASELINE_NAGLE == 1 ]] && baseline_args+=(--no-tcp-nodelay)
start baseline "$work/baseline.out" "$baseline_bin" "${baseline_args[@]}"
baseline_addr=$addr
baseline_pid=$started_pid
echo "== allot on $allot_addr, baseline on $baseline_addr; cases: $CASES"

# Sanity: both answer each review with HTTP 200 and its uid; allot's /mutate answer to a Pod
# that needs placement carries its patch.
if command -v curl >/dev/null 2>&1; then
    for case in $CASES; do
        fixture=$(fixture_of "${case#*:}")
        for server in allot baseline; do
            addr=${server}_addr
            curl -sS --fail --max-time 5 --cacert "$work/certs/ca.crt" -H 'content-type: application/json' \
                --data-binary "@$fixture" "https://${!addr}/${case%%:*}" >"$work/$server.answer"
            echo "   $case $server answers: $(head -c 120 "$work/$server.answer")..."
            grep -q '"uid"' "$work/$server.answer" || { echo "load.sh: $server's answer has no uid" >&2; exit 1; }
        done
        if [[ $case == mutate:010 ]]; then
            grep -q '"patch"' "$work/allot.answer" || { echo "load.sh: allot's answer has no patch" >&2; exit 1; }
        fi
    done
fi

# --- runs ----------------------------------------------------------------------------------
# CPU time (user + system) a process has used, in clock ticks; "" where /proc is not there.
clk_tck=$(getconf CLK_TCK 2>/dev/null || echo 100)
cpu_ticks() {
    [[ -r /proc/$1/stat ]] || return 0
    # Fields after the command name (which may hold spaces): utime is the 12th, stime the 13th.
    sed 's/^.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'
}

# run NAME SERVER PROTO h2load-args...: one h2load run against SERVER (allot or baseline), of
# $fixture to /$url_path; appends a row to $work/results.
printf 'run\tserver\treq/s\tp50\tp90\tp99\tmax\tdone\tnon2xx\tnostatus\tcpu_us_per_req\tround\n' >"$work/results"
run() {
    local name=$1 server=$2 proto=$3
    shift 3
    local addr_var=${server}_addr pid_var=${server}_pid
    local addr=${!addr_var} pid=${!pid_var}
    local log=$work/${name//\//_}-$server-$round.log out=$work/${name//\//_}-$server-$round.out
    echo "== $name: $server, round $round of $ROUNDS ($*)"
    local cpu_before cpu_after
    cpu_before=$(cpu_ticks "$pid")
    h2load "$@" --log-file="$log" -H 'content-type: application/json' -d "$fixture" \
        "https://$addr/$url_path" >"$out" 2>&1 || { cat "$out" >&2; exit 1; }
    cpu_after=$(cpu_ticks "$pid")
    grep -q "Application protocol: $proto" "$out" || { echo "load.sh: expected $proto" >&2; cat "$out" >&2; exit 1; }
    local rps completed failed unanswered p50 p90 p99 max
    rps=$(sed -n 's/^finished in [^,]*, \([0-9.]*\) req\/s.*/\1/p' "$out")
    completed=$(sed -n 's/^requests: .* \([0-9]*\) done.*/\1/p' "$out")
    # Status 0: no response in the log, e.g. a request cut off when the run ended.
    failed=$(awk -F'\t' '$2 !~ /^2/ && $2 != 0 {n++} END {print n+0}' "$log")
    unanswered=$(awk -F'\t' '$2 == 0 {n++} END {print n+0}' "$log")
    # Nearest-rank percentiles of the per-request latencies (µs, third column).
    read -r p50 p90 p99 max < <(cut -f3 "$log" | sort -n | awk '
        { v[NR] = $1 }
        function pct(p,  i) { i = int((p * NR + 99) / 100); if (i < 1) i = 1; return v[i] }
        END { if (NR == 0) print "- - - -"; else print pct(50), pct(90), pct(99), v[NR] }')
    # Server CPU per request: the cost that does not depend on how much of the 2 cores the load
    # generator takes. The CPU time covers warm-up and main phase; h2load counts the main phase
    # only, so the count is scaled by (duration + warm-up) / duration.
    local cpu_per_req=-
    if [[ -n $cpu_before && -n $cpu_after ]]; then
        cpu_per_req=$(awk -v t=$((cpu_after - cpu_before)) -v hz="$clk_tck" -v n="$completed" \
            -v d="$DURATION" -v w="$WARMUP" 'BEGIN { if (n > 0) printf "%.1f", t / hz * 1e6 / (n * (d + w) / d); else print "-" }')
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$server" "$rps" "$p50" "$p90" "$p99" "$max" \
        "$completed" "$failed" "$unanswered" "$cpu_per_req" "$round" >>"$work/results"
    sed -n '/^finished in/p;/^requests:/p;/^status codes:/p;/^time for request:/p' "$out" | sed 's/^/   /'
    if ((failed + unanswered > 0)); then
        echo "   not 2xx in the log (status: count; 0 = no response):" \
            "$(awk -F'\t' '$2 !~ /^2/ {n[$2]++} END {for (s in n) printf "%s: %d  ", s, n[s]}' "$log")"
    fi
}

h1=(--h1 -c "$H1_CLIENTS" -D "$DURATION" --warm-up-time="$WARMUP")
h2=(-c "$H2_CLIENTS" -m "$H2_STREAMS" -D "$DURATION" --warm-up-time="$WARMUP")
rate=(--h1 -c "$RATE_CLIENTS" --rps "$RATE_PER_CLIENT" -D "$DURATION" --warm-up-time="$WARMUP")
# Rounds outermost: a slow minute on the shared machine lands in one round of every case, not in
# every round of one case.
for round in $(seq 1 "$ROUNDS"); do
    for case in $CASES; do
        url_path=${case%%:*}
        fixture=$(fixture_of "${case#*:}")
        label=$url_path-$(basename "$fixture" | cut -c1-3)
        for kind in $RUNS; do
            for server in baseline allot; do
                case $kind in
                    http1.1) run "http1.1/$label" "$server" http/1.1 "${h1[@]}" ;;
                    h2) run "h2/$label" "$server" h2 "${h2[@]}" ;;
                    rate) run "rate$((RATE_CLIENTS * RATE_PER_CLIENT))/$label" "$server" http/1.1 "${rate[@]}" ;;
                    *) echo "load.sh: unknown run $kind (http1.1, h2, rate)" >&2; exit 2 ;;
                esac
            done
        done
    done
done

# --- summary -------------------------------------------------------------------------------
echo
echo "== summary (latencies and server CPU per request in µs; ratio = allot/baseline, same round)"
awk -F'\t' -v h1c="$H1_CLIENTS" -v h2c="$H2_CLIENTS" -v h2m="$H2_STREAMS" -v rounds="$ROUNDS" \
    -v rate="$((RATE_CLIENTS * RATE_PER_CLIENT))" '
    NR == 1 { next }
    { key = $1 SUBSEP $12 SUBSEP $2; rps[key] = $3; p50[key] = $4; p90[key] = $5; p99[key] = $6; mx[key] = $7
      done[key] = $8; bad[key] = $9; none[key] = $10; cpu[key] = $11; if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1 } }
    function ratio(a, b) { return (b + 0 > 0) ? sprintf("%.2f", a / b) : "-" }
    function describe(r,  kind, label) {
        kind = r; sub(/\/.*/, "", kind); label = r; sub(/^[^\/]*\//, "", label)
        if (kind == "http1.1") return "/" label " HTTP/1.1 " h1c " conns"
        if (kind == "h2") return "/" label " HTTP/2 " h2c "x" h2m
        return "/" label " HTTP/1.1 at " rate "/s"
    }
    # median of the m values in v[1..m] (sorted here; m is small)
    function median(v, m,  i, j, t) {
        for (i = 2; i <= m; i++) for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
        return (m % 2) ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
    }
    function listed(v, m,  i, out) { out = ""; for (i = 1; i <= m; i++) out = out (i > 1 ? ", " : "") v[i]; return out }
    END {
        printf "%-38s %-9s %10s %8s %8s %8s %8s %9s %7s %9s %8s\n", "run", "server", "req/s", "p50", "p90", "p99", "max", "requests", "non-2xx", "no-status", "cpu/req"
        for (i = 1; i <= n; i++) {
            r = order[i]
            for (round = 1; round <= rounds; round++) {
                what = describe(r) (rounds > 1 ? " #" round : "")
                for (s = 0; s < 2; s++) {
                    srv = s ? "allot" : "baseline"; k = r SUBSEP round SUBSEP srv
                    printf "%-38s %-9s %10s %8s %8s %8s %8s %9s %7s %9s %8s\n", what, srv, rps[k], p50[k], p90[k], p99[k], mx[k], done[k], bad[k], none[k], cpu[k]
                }
                a = r SUBSEP round SUBSEP "allot"; b = r SUBSEP round SUBSEP "baseline"
                printf "%-38s %-9s %10s %8s %8s %8s %8s %9s %7s %9s %8s\n", "", "ratio", ratio(rps[a], rps[b]), ratio(p50[a], p50[b]), ratio(p90[a], p90[b]), ratio(p99[a], p99[b]), ratio(mx[a], mx[b]), "", "", "", ratio(cpu[a], cpu[b])
            }
        }
        print ""
        for (i = 1; i <= n; i++) {
            r = order[i]; m = 0; delete v
            if (r ~ /^http1\.1\//) {
                want = (r ~ /^http1\.1\/mutate/) ? 0.8 : 0.6
                for (round = 1; round <= rounds; round++) {
                    a = r SUBSEP round SUBSEP "allot"; b = r SUBSEP round SUBSEP "baseline"
                    if (rps[b] + 0 > 0) v[++m] = sprintf("%.2f", rps[a] / rps[b])
                }
                each = listed(v, m); got = m ? median(v, m) : -1
                printf "target: %s allot >= %.1f of baseline HTTP/1.1 throughput: %s (%s%s)\n", describe(r), want, ((m && got >= want) ? "PASS" : "FAIL"), (m ? sprintf("%.2f", got) : "-"), (rounds > 1 ? ", median of the rounds " each : "")
            }
            if (r ~ /^rate/) {
                for (round = 1; round <= rounds; round++) { a = r SUBSEP round SUBSEP "allot"; if (p99[a] != "" && p99[a] != "-") v[++m] = p99[a] + 0 }
                each = listed(v, m); got = m ? median(v, m) : -1
                printf "target: %s allot p99 < 1 ms: %s (p99 %s us%s)\n", describe(r), ((m && got < 1000) ? "PASS" : "FAIL"), (m ? got : "-"), (rounds > 1 ? ", median of the rounds " each : "")
            }
        }
        for (k in bad) if (bad[k] + 0 > 0) { print "WARNING: some requests did not get a 2xx answer"; break }
    }' "$work/results" | tee "$work/summary"
if [[ -n ${LOAD_RESULTS:-} ]]; then
    cp "$work/results" "$LOAD_RESULTS"
fi
