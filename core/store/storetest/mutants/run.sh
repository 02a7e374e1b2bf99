#!/usr/bin/env bash
# Plants each bug in this folder (one .patch each) and runs the conformance
# test its "# run:" line names, once whole and once with its random traces
# alone (checked against the reference model). Every run must fail: a
# planted bug the suite does not catch fails this script.
#
# The patched files reach the compiler through go's -overlay, so the tree is
# never touched and every package the bug does not change comes from the
# build cache.
set -u
root=$(git rev-parse --show-toplevel)
here=$root/core/store/storetest/mutants
work=$root/.tmp/mutant
survived=0
for patch in "$here"/*.patch; do
  name=$(basename "$patch" .patch)
  run=$(sed -n 's/^# run: //p' "$patch")
  rm -rf "$work" && mkdir -p "$work"
  files=$(sed -n 's|^+++ b/\([^[:space:]]*\).*|\1|p' "$patch")
  replace=""
  for f in $files; do
    mkdir -p "$work/$(dirname "$f")" && cp "$root/$f" "$work/$f"
    replace="$replace${replace:+,}\"$root/$f\":\"$work/$f\""
  done
  if ! (cd "$work" && patch -s -p1 < "$patch"); then
    echo "mutant $name: patch does not apply"; survived=1; continue
  fi
  echo "{\"Replace\":{$replace}}" > "$work/overlay.json"
  for traces in all random; do
    if (cd "$root" && eval "TOLLGATE_CONFORMANCE=$traces go test -count=1 -overlay $work/overlay.json $run" > "$work.log" 2>&1); then
      echo "mutant $name: SURVIVED $traces traces (go test $run passed with the bug planted)"
      survived=1
    else
      first=$(grep -m1 -E 'storetest.go:[0-9]+: ' "$work.log" | sed 's/^[[:space:]]*//' | cut -c1-150)
      if [ -z "$first" ]; then
        # A build failure or a crash is not the suite catching the bug.
        echo "mutant $name: $traces traces failed without a conformance mismatch:"; tail -5 "$work.log"; survived=1
      else
        echo "mutant $name: caught by $traces traces: $first"
      fi
    fi
  done
done
rm -rf "$work" "$work.log"
exit $survived
