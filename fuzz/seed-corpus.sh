#!/usr/bin/env bash
# Seeds fuzz/corpus/<target>/ (git-ignored) from the repository's own inputs:
#   admission_review: tests/fixtures/admission-reviews/*.json, fuzz/seeds/admission_review/*.json
#                     (examples/ manifests and one object per workload kind, wrapped in reviews)
#   policy_parse:     policies/*.yaml, and all of them as one multi-document file
#   update_pair:      the fixtures' UPDATE reviews as (kind byte, oldObject, NUL, object)
#   (cel_expression and tenant_update need no seeds: their inputs are a generator's choices)
# plus fuzz/regressions/<target>/* (inputs that once crashed), for every target. Safe to rerun: it only adds files.
set -euo pipefail
fuzz=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$fuzz/.." && pwd)
# The fuzz package builds the main lockfile's versions (lock.sh): made here, before any run.
"$fuzz/lock.sh"

mkdir -p "$fuzz/corpus/admission_review" "$fuzz/corpus/policy_parse" "$fuzz/corpus/update_pair"
cp "$repo"/tests/fixtures/admission-reviews/*.json "$fuzz"/seeds/admission_review/*.json "$fuzz/corpus/admission_review/"
cp "$repo"/policies/*.yaml "$fuzz/corpus/policy_parse/"
for f in "$repo"/policies/*.yaml; do
    cat "$f"
    printf '\n---\n'
done >"$fuzz/corpus/policy_parse/all-policies.yaml"
# update_pair: the old and new objects of the fixtures' UPDATE reviews, NUL-separated, after a
# kind byte (0: Pod).
for f in "$repo"/tests/fixtures/admission-reviews/*-update-*.json; do
    python3 - "$f" >"$fuzz/corpus/update_pair/$(basename "$f" .json).bin" <<'PY'
import json, sys
request = json.load(open(sys.argv[1]))["request"]
sys.stdout.buffer.write(b"\x00" + json.dumps(request["oldObject"]).encode() + b"\x00" + json.dumps(request["object"]).encode())
PY
done
for target in admission_review cel_expression policy_parse tenant_update update_pair; do
    mkdir -p "$fuzz/corpus/$target"
    if compgen -G "$fuzz/regressions/$target/*" >/dev/null; then
        cp "$fuzz/regressions/$target/"* "$fuzz/corpus/$target/"
    fi
done
for target in admission_review cel_expression policy_parse tenant_update update_pair; do
    echo "fuzz/corpus/$target: $(find "$fuzz/corpus/$target" -type f | wc -l) files"
done
