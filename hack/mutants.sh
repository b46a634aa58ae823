#!/usr/bin/env bash
# Mutation testing of the safety core with cargo-mutants, installed once per version under .testenv/. Each mutant of
# the files below is built and the ipam crate's unit and property tests run against it (property tests at 64 cases:
# PROPTEST_CASES), then the protocol's simulation at 40 generated cases (10 for each special kind;
# HEREABOUTS_SIM_CASES) with its regressions replayed in full; a mutant they do not catch is a guard, rule or step no
# test needs. Mutants that cannot be caught because they change nothing observable are excluded in
# .cargo/mutants.toml, each with its reason. Too slow for CI (two mutants at a time, about 20 s each on 2 cores, a
# hang 150 s): `hack/mutants.sh` runs every file, `hack/mutants.sh ipam/src/store/guard.rs` one. The report goes to
# target/mutants/mutants.out (missed.txt lists what survived; timeout.txt what hung: a broken guard often makes
# every write fail and retry until its budget, so a timeout counts as caught only once a test is seen to fail fast
# on it). HEREABOUTS_MUTANT_ITERATE=1 skips what the last run caught.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version=27.1.0
dir=${HEREABOUTS_TESTENV:-$root/.testenv}/cargo-mutants-$version
if [[ ! -x $dir/bin/cargo-mutants ]]; then
  echo "mutants: installing cargo-mutants $version into $dir ..." >&2
  cargo install --locked --quiet cargo-mutants --version "$version" --root "$dir"
fi
files=("$@")
if [[ ${#files[@]} -eq 0 ]]; then
  files=(
    ipam/src/store/guard.rs
    ipam/src/reconcile/rules.rs
    ipam/src/slices/plan.rs
    ipam/src/slices/growth.rs
    ipam/src/warm/journal.rs
    ipam/src/warm/reserve.rs
    ipam/src/reconcile/relayout.rs
    ipam/src/marks.rs
    ipam/src/claim/replaces.rs
  )
fi
cd "$root"
args=()
for file in "${files[@]}"; do args+=(--file "$file"); done
[[ ${HEREABOUTS_MUTANT_ITERATE:-} == 1 ]] && args+=(--iterate)
mkdir -p target/mutants
echo "mutants: ${files[*]} -> target/mutants/mutants.out" >&2
PROPTEST_CASES=${PROPTEST_CASES:-64} HEREABOUTS_SIM_CASES=${HEREABOUTS_SIM_CASES:-40} "$dir/bin/cargo-mutants" mutants \
  --package hereabouts-ipam "${args[@]}" --output target/mutants --jobs "${HEREABOUTS_MUTANT_JOBS:-2}" \
  --timeout "${HEREABOUTS_MUTANT_TIMEOUT:-150}" --baseline skip --no-shuffle -- --lib --test simulation
