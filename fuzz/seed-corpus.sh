#!/usr/bin/env bash
# Seeds fuzz/corpus/<target>/ (git-ignored) from the repository's own inputs:
#   admission_review: tests/fixtures/admission-reviews/*.json, fuzz/seeds/admission_review/*.json
#                     (examples/ manifests and one object per workload kind, wrapped in reviews)
#   policy_parse:     policies/*.yaml, and all of them as one multi-document file
# plus fuzz/regressions/<target>/* (inputs that once crashed). Safe to rerun: it only adds files.
set -euo pipefail
fuzz=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$fuzz/.." && pwd)

mkdir -p "$fuzz/corpus/admission_review" "$fuzz/corpus/policy_parse"
cp "$repo"/tests/fixtures/admission-reviews/*.json "$fuzz"/seeds/admission_review/*.json "$fuzz/corpus/admission_review/"
cp "$repo"/policies/*.yaml "$fuzz/corpus/policy_parse/"
for f in "$repo"/policies/*.yaml; do
    cat "$f"
    printf '\n---\n'
done >"$fuzz/corpus/policy_parse/all-policies.yaml"
for target in admission_review policy_parse; do
    if compgen -G "$fuzz/regressions/$target/*" >/dev/null; then
        cp "$fuzz/regressions/$target/"* "$fuzz/corpus/$target/"
    fi
done
for target in admission_review policy_parse; do
    echo "fuzz/corpus/$target: $(find "$fuzz/corpus/$target" -type f | wc -l) files"
done
