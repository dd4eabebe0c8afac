#!/usr/bin/env bash
# Allot at cluster scale (issue 18): runs tests/scale.rs against a release build of `allot`
# on a throwaway kube-apiserver + etcd from ../shared/k8s (or the TEST_ASSET_* binaries), and
# prints RSS empty / grown / after a restart (peak, settled, time to settle) and creates/s with
# Allot as a ratio to no webhook at 0 and at N pods (alternated in the same run). Then, on the
# restarted Allot, the waiting-gangs phase (issue 49): G incomplete gangs behind the gate,
# Allot's CPU over ALLOT_SCALE_IDLE_SECS with nothing happening and the time of a /metrics scrape
# (bars at full size: < 5 % of a core, < 50 ms, printed as PASS/FAIL from N=100000); then one
# more restart with the gangs waiting, for their memory at rest (per gang).
#
# Usage: scripts/scale.sh [N [G]]    (default N=100000, G=1000; env: ALLOT_SCALE_CLIENTS=80,
#        ALLOT_SCALE_BATCH, ALLOT_SCALE_ROUNDS=2, ALLOT_SCALE_OBSERVE_SECS=30,
#        ALLOT_SCALE_BIN=path/to/allot to measure another build, SKIP_BUILD=1,
#        ALLOT_SCALE_BASELINE_BIN=path/to/baseline-server (default: the release build of the
#        example, built here) to compare with the trivial webhook and with one that returns
#        Allot's patch (ALLOT_SCALE_BASELINE_PATCH=none leaves that one out),
#        ALLOT_SCALE_NO_QUOTA=1 for a team without quota: no ledger commit per create,
#        ALLOT_SCALE_GANG_SIZE=4: members each gang declares (one fewer are created),
#        ALLOT_SCALE_IDLE_SECS=30)
# CI runs the same test at N=300 and G=20 with a debug build (`cargo test --test scale`).
# etcd's data lives in a temporary directory under ${TMPDIR:-/tmp}, removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
export ALLOT_SCALE_PODS=${1:-100000}
export ALLOT_SCALE_GANGS=${2:-${ALLOT_SCALE_GANGS:-1000}}
export ALLOT_SCALE_CLIENTS=${ALLOT_SCALE_CLIENTS:-80}
export ALLOT_SCALE_OBSERVE_SECS=${ALLOT_SCALE_OBSERVE_SECS:-30}
if [ -z "${TEST_ASSET_KUBE_APISERVER:-}" ]; then
  eval "$(../shared/k8s/unpack.sh target/k8s-bin)"
fi
if [ -z "${ALLOT_SCALE_BIN:-}" ]; then
  [ "${SKIP_BUILD:-0}" = 1 ] || cargo build --locked --release --bin allot --example baseline-server
  ALLOT_SCALE_BIN="$PWD/target/release/allot"
  export ALLOT_SCALE_BIN
fi
if [ -z "${ALLOT_SCALE_BASELINE_BIN:-}" ] && [ -x target/release/examples/baseline-server ]; then
  ALLOT_SCALE_BASELINE_BIN="$PWD/target/release/examples/baseline-server"
  export ALLOT_SCALE_BASELINE_BIN
fi
cargo test --locked --test scale -- --nocapture --test-threads 1
