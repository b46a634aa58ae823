#!/usr/bin/env bash
# cargo deny, installed once per version under .testenv/. Checks licenses, bans and sources. The advisories check
# needs the RustSec database from a git host this project's machines cannot reach (only package registries are),
# so it runs only where HEREABOUTS_DENY_ADVISORIES=1 says the database can be fetched.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version=0.20.2
dir=${HEREABOUTS_TESTENV:-$root/.testenv}/cargo-deny-$version
if [[ ! -x $dir/bin/cargo-deny ]]; then
  echo "deny: installing cargo-deny $version into $dir ..." >&2
  cargo install --locked --quiet cargo-deny --version "$version" --root "$dir"
fi
checks=(licenses bans sources)
[[ ${HEREABOUTS_DENY_ADVISORIES:-0} == 1 ]] && checks+=(advisories)
cd "$root" && "$dir/bin/cargo-deny" --log-level warn check "${checks[@]}"
