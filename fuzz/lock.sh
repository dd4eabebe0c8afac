#!/usr/bin/env bash
# Makes fuzz/Cargo.lock from the main crate's Cargo.lock, so the fuzz targets build the very
# versions Allot ships (run it before `cargo fuzz`; seed-corpus.sh runs it too).
#
# The fuzz package has its own empty workspace, so cargo would otherwise resolve it afresh, at
# the newest versions (a newer rustls than the project ships, with its deprecation warnings,
# and a fuzzed stack that is not the one released). From a copy of the main lockfile cargo keeps
# every version locked there and only adds what the fuzz package alone needs (libfuzzer-sys and
# its build dependencies). The script then checks that no package both lockfiles name has a
# version the main one does not lock, and fails if one does.
#
# fuzz/Cargo.lock stays git-ignored: it is derived, and made again on every run, so it cannot
# fall behind the main lockfile.
set -euo pipefail
cd "$(dirname "$0")"
cp ../Cargo.lock Cargo.lock
# Resolves without building: keeps the copied versions, adds the fuzz-only packages.
cargo metadata --format-version 1 >/dev/null
# "name version" of every package in a lockfile.
pairs() { awk '/^name = /{name=$3} /^version = /{print name, $3}' "$1" | tr -d '"' | sort -u; }
drift=$(awk 'NR == FNR {locked[$1 " " $2] = 1; named[$1] = 1; next}
             ($1 in named) && !(($1 " " $2) in locked)' <(pairs ../Cargo.lock) <(pairs Cargo.lock))
if [ -n "$drift" ]; then
  echo "fuzz/Cargo.lock has versions the main Cargo.lock does not lock:" >&2
  echo "$drift" >&2
  exit 1
fi
echo "fuzz/Cargo.lock: the main lockfile's versions, plus $(comm -13 <(pairs ../Cargo.lock | cut -d' ' -f1 | sort -u) <(pairs Cargo.lock | cut -d' ' -f1 | sort -u) | wc -l) fuzz-only packages"
