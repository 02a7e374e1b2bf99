#!/usr/bin/env bash
# Plants each bug in this folder (one .patch each) in a scratch copy of the
# tree and runs the conformance test its "# run:" line names there, once
# whole and once with its random traces alone (checked against the reference
# model). Every run must fail: a planted bug the suite does not catch fails
# this script.
set -u
root=$(git rev-parse --show-toplevel)
here=$root/core/store/storetest/mutants
work=$root/.tmp/mutant
survived=0
for patch in "$here"/*.patch; do
  name=$(basename "$patch" .patch)
  run=$(sed -n 's/^# run: //p' "$patch")
  rm -rf "$work" && mkdir -p "$work"
  (cd "$root" && git ls-files -z | xargs -0 cp --parents -t "$work")
  if ! (cd "$work" && patch -s -p1 < "$patch"); then
    echo "mutant $name: patch does not apply"; survived=1; continue
  fi
  for traces in all random; do
    if (cd "$work" && eval "TOLLGATE_CONFORMANCE=$traces go test -count=1 $run" > "$work.log" 2>&1); then
      echo "mutant $name: SURVIVED $traces traces (go test $run passed with the bug planted)"
      survived=1
    else
      first=$(grep -m1 -E 'storetest.go:[0-9]+: ' "$work.log" | sed 's/^[[:space:]]*//' | cut -c1-150)
      echo "mutant $name: caught by $traces traces: $first"
    fi
  done
done
rm -rf "$work" "$work.log"
exit $survived
