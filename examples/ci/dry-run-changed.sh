#!/usr/bin/env bash
# Dry-runs the Kubernetes manifests a pull request adds or changes, with `allot check`, and
# prints GitHub annotations on the file and line of each denial and warning.
#
# Usage: dry-run-changed.sh BASE [DIR...]
#   BASE  what the change is compared with: a branch or commit (in GitHub Actions,
#         origin/$GITHUB_BASE_REF; the checkout needs `fetch-depth: 0` for the merge base)
#   DIR   where the manifests live (default: manifests/); only .yaml, .yml and .json files
#         under them that exist after the change are checked (a deleted manifest is not)
#
# Environment: POLICIES (default policies/), NAMESPACES (a Namespace manifest file for Team
# label selectors, optional), OUTPUT (default github; text, json or junit also work),
# ALLOT (default allot).
#
# Exit status is allot check's: 0 everything admitted (or nothing to check), 1 something
# denied, 2 bad input or bad policies. Files are checked together, in one run, so gang members
# in two changed files are compared; manifests that did not change are not read.
#
# Copy this file into the policy repository (e.g. ci/allot-dry-run-changed.sh);
# tests/ci_example.rs in Allot's repository runs it against a scratch Git repository.
set -euo pipefail

if [ $# -lt 1 ]; then
  echo "usage: $0 BASE [DIR...]" >&2
  exit 2
fi
base="$1"
shift
if [ $# -eq 0 ]; then
  set -- manifests/
fi
if [ "$(git rev-parse --show-toplevel)" != "$(pwd -P)" ]; then
  echo "$0: run from the repository's top directory (git diff names files from there)" >&2
  exit 2
fi
allot="${ALLOT:-allot}"
policies="${POLICIES:-policies/}"
output="${OUTPUT:-github}"

# Files added, copied, modified, renamed or retyped since the merge base with BASE (not
# deleted), NUL-separated so that any file name survives.
changed=()
while IFS= read -r -d '' file; do
  case "$file" in
    # ./ so that a file named - is not read as stdin.
    *.yaml | *.yml | *.json)
      if [ -f "$file" ]; then
        changed+=("./$file")
      fi
      ;;
  esac
done < <(git diff --name-only -z --diff-filter=ACMRT "$base...HEAD" -- "$@")

if [ ${#changed[@]} -eq 0 ]; then
  echo "allot: no manifest changed under $* since $base" >&2
  exit 0
fi

echo "allot: checking ${#changed[@]} changed manifest file(s) against $policies" >&2
args=(check --policies "$policies" --output "$output")
if [ -n "${NAMESPACES:-}" ]; then
  args+=(--namespaces "$NAMESPACES")
fi
exec "$allot" "${args[@]}" "${changed[@]}"
