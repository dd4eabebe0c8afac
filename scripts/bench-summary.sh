#!/usr/bin/env bash
# Prints the results of the last `cargo bench --bench engine` run as ratios to
# `baseline/parse-json-value` (serde_json::from_slice::<Value> of the same AdmissionReview),
# measured in the same run: on a shared, noisy machine the ratios are what compare across runs.
# Reads criterion's target/criterion/<id>/new/estimates.json (median, with its 95% interval).
#
# Usage: cargo bench --bench engine && scripts/bench-summary.sh
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
command -v python3 >/dev/null 2>&1 || { echo "bench-summary.sh: needs python3" >&2; exit 2; }
target_dir=$(cargo metadata --no-deps --format-version 1 | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
python3 - "$target_dir/criterion" <<'PY'
import json, os, sys
root = sys.argv[1]
ids = ["baseline/parse-json-value", "review/mutate-010", "review/validate-010", "engine/mutate-pod-010",
       "engine/admit-pod-010", "engine/validate-pytorchjob", "engine/validate-jobset", "policy/load-dir",
       "cel/rules-contained", "cel/rules-uncontained", "cel/bind-pod-011"]
# Issue 13's validating reviews, each against its own decoding baseline.
pairs = [("baseline/decode-011", ["review/validate-011", "engine/validate-pod-011"]),
         ("baseline/decode-002", ["review/validate-002"]),
         ("baseline/decode-019", ["review/validate-019"])]
def median(bench_id):
    path = os.path.join(root, bench_id.replace("/", "_"), "new", "estimates.json")
    try:
        m = json.load(open(path))["median"]
    except FileNotFoundError:
        return None
    ci = m["confidence_interval"]
    return m["point_estimate"], ci["lower_bound"], ci["upper_bound"]
base = median(ids[0])
if base is None:
    sys.exit("bench-summary.sh: no results under %s; run `cargo bench --bench engine` first" % root)
fmt = lambda ns: "%.2f ms" % (ns / 1e6) if ns >= 1e6 else "%.2f µs" % (ns / 1e3)
print("%-28s %12s %25s %10s" % ("benchmark", "median", "95% interval", "x baseline"))
for bench_id in ids:
    r = median(bench_id)
    if r is None:
        print("%-28s %12s" % (bench_id, "(not run)"))
        continue
    point, lo, hi = r
    print("%-28s %12s %25s %10.2f" % (bench_id, fmt(point), fmt(lo) + " .. " + fmt(hi), point / base[0]))
for base_id, others in pairs:
    b = median(base_id)
    if b is None:
        continue
    print("\n%-28s %12s %25s %10s" % (base_id, fmt(b[0]), fmt(b[1]) + " .. " + fmt(b[2]), "1.00"))
    for bench_id in others:
        r = median(bench_id)
        if r is not None:
            print("%-28s %12s %25s %10.2f" % (bench_id, fmt(r[0]), fmt(r[1]) + " .. " + fmt(r[2]), r[0] / b[0]))
r = median("engine/validate-pod-011")
b = median("baseline/decode-011")
if r is not None and b is not None:
    print("\ntarget: engine/validate-pod-011 within 2x of baseline/decode-011: %s (%.2fx)" % ("PASS" if r[0] <= 2 * b[0] else "FAIL", r[0] / b[0]))
r = median("review/mutate-010")
if r is not None:
    print("\ntarget: review/mutate-010 < 20 µs: %s (%s)" % ("PASS" if r[0] < 20e3 else "FAIL", fmt(r[0])))
PY
