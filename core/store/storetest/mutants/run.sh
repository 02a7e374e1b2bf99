#!/usr/bin/env bash
# Plants each bug in this folder (one .patch each), and in every other
# mutants folder of the tree (a store that lives beside its adapter keeps
# its planted bugs there), and runs the conformance
# test its "# run:" line names, once whole and once with its random traces
# alone (checked against the reference model). Every run must fail with a
# conformance mismatch: a planted bug the suite does not catch, or one that
# does not build, fails this script. A bug outside the stores (the request
# pipeline's charge) names its test's failure line in a "# catch:" regex
# instead; its test has no trace sets, and runs once.
#
# The patched files reach the compiler through go's -overlay, so the tree is
# never touched and every package the bug does not change comes from the
# build cache; -race, as make test builds everything, so a cold run compiles
# nothing twice; -vet=off, since a planted bug is not code to vet (make
# test vets the tree itself). Each mutant's test binary is linked once and
# run for both trace sets. Three mutants run at a time: a run mostly waits
# on its test's servers starting, while another mutant builds.
set -u
root=$(git rev-parse --show-toplevel)
here=$root/core/store/storetest/mutants
work=$root/.tmp/mutants
rm -rf "$work" && mkdir -p "$work"

# plant <patch>: prints one line per trace set; exits 1 if the bug survives.
plant() {
  local patch=$1 name dir run catch files replace="" f traces first status=0 pkg args sets tmp passed
  name=$(basename "$patch" .patch)
  dir=$work/$name
  run=$(sed -n 's/^# run: //p' "$patch")
  catch=$(sed -n 's/^# catch: //p' "$patch")
  files=$(sed -n 's|^+++ b/\([^[:space:]]*\).*|\1|p' "$patch")
  for f in $files; do
    mkdir -p "$dir/$(dirname "$f")" && cp "$root/$f" "$dir/$f"
    replace="$replace${replace:+,}\"$root/$f\":\"$dir/$f\""
  done
  if ! (cd "$dir" && patch -s -p1 < "$patch"); then
    echo "mutant $name: patch does not apply"; return 1
  fi
  echo "{\"Replace\":{$replace}}" > "$dir/overlay.json"
  # One test binary per mutant, run twice: "./pkg -run 'X'" runs as
  # pkg.test -test.run 'X' in the package's directory, as go test runs it.
  pkg=${run%% *} args=$(printf '%s' "${run#* }" | sed 's/^-run /-test.run /')
  if ! (cd "$root" && go test -race -vet=off -c -o "$dir/test.bin" -overlay "$dir/overlay.json" "$pkg") > "$dir/build.log" 2>&1; then
    echo "mutant $name: does not build:"; tail -5 "$dir/build.log"; return 1
  fi
  sets="all random"
  [ -n "$catch" ] && sets="all"
  for traces in $sets; do
    # Its temporary files (Redis' and Postgres' directories) in a
    # directory of its own, removed after: a planted bug that crashes the
    # test leaves nothing behind. Under the system's temporary directory,
    # not the checkout: Postgres runs as its own user, which must reach it.
    tmp=$(mktemp -d -t tollgate-mutant.XXXXXX) && chmod 755 "$tmp"
    (cd "$root/$pkg" && eval "TMPDIR=$tmp TOLLGATE_CONFORMANCE=$traces $dir/test.bin -test.count=1 $args" > "$dir/$traces.log" 2>&1)
    passed=$?
    rm -rf "$tmp"
    if [ "$passed" = 0 ]; then
      echo "mutant $name: SURVIVED $traces traces (go test $run passed with the bug planted)"
      status=1
      continue
    fi
    # A conformance mismatch, or a Lua twin's (adaptive rules) mismatch
    # with its Go rule; the twin tests replay the same traces either way.
    first=$(grep -m1 -E "${catch:-storetest.go:[0-9]+: |_test.go:[0-9]+: seed [0-9]+ .*Lua}" "$dir/$traces.log" | sed 's/^[[:space:]]*//' | cut -c1-150)
    if [ -z "$first" ]; then
      # A build failure or a crash is not the suite catching the bug.
      echo "mutant $name: $traces traces failed without a conformance mismatch:"
      tail -5 "$dir/$traces.log"
      status=1
    else
      echo "mutant $name: caught by $traces traces: $first"
    fi
  done
  return $status
}
export -f plant
export root work

survived=0
{ printf '%s\0' "$here"/*.patch
  find "$root" -path "$root/.git" -prune -o -path "$root/.tmp" -prune -o -path "$here" -prune -o -path '*/mutants/*.patch' -print0
} | xargs -0 -n1 -P3 bash -c 'plant "$0"' || survived=1
rm -rf "$work"
exit $survived
