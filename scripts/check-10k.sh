#!/usr/bin/env bash
# `allot check` over many manifests (issue 13: 10,000 manifests < 2 s). Generates N manifests
# (default 10,000; one file each) shaped like examples/: one-GPU pods, CPU pods, MIG pods, pods
# without a team, Indexed Jobs, two-worker gangs, PyTorchJobs, spread over the namespaces of
# examples/cluster/namespaces.yaml, then times `allot check` (release) over the directory RUNS
# times (hyperfine if installed, else date), alternated with a one-manifest run (start-up and
# policy load: the fixed cost). Some manifests are denied on purpose, as in
# examples/, so the exit status of `allot check` is 1; the script checks that it reported on
# every manifest instead.
#
# Usage: scripts/check-10k.sh [N]   (env: RUNS=3, SKIP_BUILD=1, KEEP_WORK=1, ALLOT_BIN=path)
set -euo pipefail
cd "$(dirname "$0")/.."
count=${1:-10000}
runs=${RUNS:-3}
if [ -z "${ALLOT_BIN:-}" ]; then
  [ "${SKIP_BUILD:-0}" = 1 ] || cargo build --locked --release --bin allot
  ALLOT_BIN="$PWD/target/release/allot"
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/allot-check-XXXXXX")
[ "${KEEP_WORK:-0}" = 1 ] && echo "work dir: $work" || trap 'rm -rf "$work"' EXIT
mkdir -p "$work/manifests"

python3 - "$work/manifests" "$count" <<'PY'
import sys, os
out, count = sys.argv[1], int(sys.argv[2])
namespaces = ["vision", "nlp-research", "scratch"]

def container(name, image, limits, requests=None, indent=4):
    pad = " " * indent
    text = f"{pad}- name: {name}\n{pad}  image: {image}\n{pad}  resources:\n"
    if requests:
        text += f"{pad}    requests:\n" + "".join(f"{pad}      {k}: {v}\n" for k, v in requests.items())
    text += f"{pad}    limits:\n" + "".join(f"{pad}      {k}: {v}\n" for k, v in limits.items())
    return text

def pod(name, ns, limits, requests=None, labels=None, annotations=None):
    meta = f"metadata:\n  name: {name}\n  namespace: {ns}\n"
    if labels:
        meta += "  labels:\n" + "".join(f"    {k}: {v}\n" for k, v in labels.items())
    if annotations:
        meta += "  annotations:\n" + "".join(f'    {k}: "{v}"\n' for k, v in annotations.items())
    return ("apiVersion: v1\nkind: Pod\n" + meta + "spec:\n  containers:\n"
            + container("main", "nvidia/cuda:12.4.1-runtime-ubuntu22.04", limits, requests))

def job(name, ns, workers, gpus):
    return (f"apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: {name}\n  namespace: {ns}\n"
            f"spec:\n  completionMode: Indexed\n  completions: {workers}\n  parallelism: {workers}\n"
            "  template:\n    spec:\n      restartPolicy: Never\n      containers:\n"
            + container("worker", "ghcr.io/example/mnist-ddp:1.4.0",
                        {"nvidia.com/gpu": gpus, "memory": "16Gi"}, indent=8))

def pytorchjob(name, ns, gpus):
    spec = ""
    for role, replicas in (("Master", 1), ("Worker", 3)):
        spec += (f"    {role}:\n      replicas: {replicas}\n      template:\n        spec:\n"
                 "          containers:\n"
                 + container("pytorch", "ghcr.io/example/bert:2.1.0", {"nvidia.com/gpu": gpus}, indent=12))
    return (f"apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata:\n  name: {name}\n  namespace: {ns}\n"
            "spec:\n  pytorchReplicaSpecs:\n" + spec)

kinds = {}
for i in range(count):
    ns = namespaces[i % len(namespaces)]
    slot = i % 20
    if slot < 8:
        kind, text = "gpu-pod", pod(f"gpu-{i}", ns, {"nvidia.com/gpu": 1 + i % 2})
    elif slot < 10:
        kind, text = "cpu-pod", pod(f"cpu-{i}", ns, {"cpu": 2, "memory": "4Gi"})
    elif slot == 10:
        kind, text = "mig-pod", pod(f"mig-{i}", ns, {"nvidia.com/mig-1g.10gb": 1})
    elif slot == 11:
        kind, text = "no-team-pod", pod(f"noteam-{i}", "default", {"nvidia.com/gpu": 1})
    elif slot < 15:
        kind, text = "indexed-job", job(f"job-{i}", ns, 2 + i % 4, 1)
    elif slot < 19:
        # Both members of a gang in one namespace.
        gang, ns = f"gang-{i // 2}", namespaces[(i // 2) % len(namespaces)]
        kind, text = "gang-member", pod(f"{gang}-w{i % 2}", ns, {"nvidia.com/gpu": 4},
                                        labels={"allot.dev/gang-name": gang},
                                        annotations={"allot.dev/gang-size": 2})
    else:
        kind, text = "pytorchjob", pytorchjob(f"ptj-{i}", ns, 1)
    kinds[kind] = kinds.get(kind, 0) + 1
    with open(os.path.join(out, f"{i:05d}-{kind}.yaml"), "w") as f:
        f.write(text)
print(f"generated {count} manifests: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
PY

check=("$ALLOT_BIN" check --policies policies/ --namespaces examples/cluster/namespaces.yaml "$work/manifests")
# One untimed run: the report must cover every manifest (denials are expected, a crash is not).
status=0
"${check[@]}" >"$work/report.txt" 2>&1 || status=$?
if [ "$status" -gt 1 ]; then
  echo "allot check failed (exit $status):" >&2
  tail -20 "$work/report.txt" >&2
  exit 1
fi
echo "allot check exit status $status; last lines of its report:"
tail -3 "$work/report.txt"

# Same-run baseline: the fixed cost (start, load and compile policies/, one manifest), timed
# alternately with the full run.
mkdir -p "$work/one"
cp "$work/manifests/00000-gpu-pod.yaml" "$work/one/"
one=("$ALLOT_BIN" check --policies policies/ --namespaces examples/cluster/namespaces.yaml "$work/one")
if command -v hyperfine >/dev/null; then
  hyperfine --runs "$runs" --warmup 1 -i "${one[*]}" "${check[*]}"
else
  # Wall and CPU (user + system) seconds of one run; CPU depends less on the other load.
  seconds() { local TIMEFORMAT='%R %U %S'; { time "$@" >/dev/null 2>&1; } 2>&1 || true; }
  for run in $(seq "$runs"); do
    read -r base_wall base_user base_sys < <(seconds "${one[@]}")
    read -r wall user sys < <(seconds "${check[@]}")
    awk -v bw="$base_wall" -v bc="$(awk -v u="$base_user" -v s="$base_sys" 'BEGIN { print u + s }')" \
      -v w="$wall" -v c="$(awk -v u="$user" -v s="$sys" 'BEGIN { print u + s }')" -v n="$count" -v r="$run" 'BEGIN {
      printf "run %d: %d manifests %.3f s wall, %.3f s CPU (%.1f us wall each); 1 manifest %.3f s wall, %.3f s CPU; marginal %.1f us wall per manifest\n",
        r, n, w, c, w * 1e6 / n, bw, bc, (w - bw) * 1e6 / (n - 1) }'
  done
fi
