#!/usr/bin/env bash
# Mutation testing of the safety core with cargo-mutants, installed once per version under .testenv/. Each mutant of
# the files below is built and the ipam crate's unit and property tests run against it, then the protocol's
# simulation at 40 generated cases (10 for each special kind; HEREABOUTS_SIM_CASES) with its regressions replayed in
# full; a mutant they do not catch is a guard, rule or step no test needs. Mutants that cannot be caught because they
# change nothing observable are excluded in .cargo/mutants.toml, each with its reason. Too slow for CI (a minute or
# more a mutant on 2 cores): `hack/mutants.sh` runs every file, `hack/mutants.sh ipam/src/store/guard.rs` one; the
# report goes to target/mutants/<file>/mutants.out (missed.txt lists what survived, timeout.txt what hung: a broken
# guard often makes every write fail and retry until its budget, which counts as caught only once looked at).
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
status=0
for file in "${files[@]}"; do
  out=target/mutants/$(basename "$file" .rs)
  mkdir -p "$out"
  echo "mutants: $file -> $out" >&2
  HEREABOUTS_SIM_CASES=${HEREABOUTS_SIM_CASES:-40} "$dir/bin/cargo-mutants" mutants --package hereabouts-ipam \
    --file "$file" --output "$out" --jobs 1 --timeout ${HEREABOUTS_MUTANT_TIMEOUT:-180} --baseline skip -- --lib --test simulation || status=$?
done
exit $status
