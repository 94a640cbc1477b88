#!/usr/bin/env bash
# Checks the step protocol's model (docs/model.md): the clean model must
# pass every check, and each seeded bug must fail with a counter-example,
# whose trail is compared with the one kept in model/trails/.
#   model/check.sh           every check
#   model/check.sh NAME...   those named (clean, lease, race, bug names)
# Needs spin and gcc. Prints the states explored and the seconds of each.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp "$here/saga.pml" "$work/"
cd "$work"

# name | expect (pass/fail) | spin -D switches | pan options
checks=(
  "clean|pass|-DNT=1 -DREPLICAS=1 -DFAULTS=2 -DCRASHES=1|"
  "lease|pass|-DNT=1 -DRH=2 -DRP=1 -DRC=1 -DFAULTS=1 -DCRASHES=1|"
  "race|pass|-DNT=2 -DREPLICAS=1 -DFAULTS=1 -DCRASHES=0 -DNOREJECT|bitstate"
  "BUG_CALL_BEFORE_LOG|fail|-DNT=1 -DREPLICAS=1 -DFAULTS=0 -DCRASHES=1 -DBUG_CALL_BEFORE_LOG|"
  "BUG_TIMEOUT_FAILS|fail|-DNT=1 -DREPLICAS=1 -DFAULTS=1 -DCRASHES=0 -DBUG_TIMEOUT_FAILS|"
  "BUG_INBOX_APART|fail|-DNT=1 -DREPLICAS=1 -DFAULTS=0 -DCRASHES=1 -DBUG_INBOX_APART|"
  "BUG_LEASE_LIVE|fail|-DNT=1 -DRH=2 -DRP=1 -DRC=1 -DFAULTS=1 -DCRASHES=0 -DBUG_LEASE_LIVE|"
  "STRICT|fail|-DNT=1 -DREPLICAS=1 -DFAULTS=2 -DCRASHES=0 -DSTRICT|"
)
want=("$@")
status=0
for c in "${checks[@]}"; do
  IFS='|' read -r name expect defs mode <<<"$c"
  if [ ${#want[@]} -gt 0 ]; then
    hit=0
    for w in "${want[@]}"; do if [ "$w" = "$name" ]; then hit=1; fi; done
    [ $hit = 1 ] || continue
  fi
  start=$(date +%s.%N)
  # shellcheck disable=SC2086
  spin -a $defs saga.pml >/dev/null
  cflags="-DSAFETY -DCOLLAPSE"
  popts="-m200000 -w24"
  if [ "$mode" = bitstate ]; then cflags="-DSAFETY -DBITSTATE"; popts="-m200000 -w28"; fi
  # -O0: pan.c is large and the search is short; -O2 costs minutes of compiling.
  # shellcheck disable=SC2086
  gcc -O0 -w $cflags -o pan pan.c
  rm -f saga.pml.trail
  # shellcheck disable=SC2086
  out=$(./pan $popts 2>&1 || true)
  secs=$(echo "$(date +%s.%N) - $start" | bc)
  states=$(echo "$out" | awk '/states, stored/ && !d {print $1; d = 1}')
  errors=$(echo "$out" | sed -n 's/.*errors: \([0-9]*\).*/\1/p' | tail -1)
  got=pass
  [ "${errors:-1}" != 0 ] && got=fail
  if [ "$got" = fail ] && [ ! -e saga.pml.trail ]; then got="fail (no trail)"; fi
  verdict=ok
  if [ "$got" != "$expect" ]; then verdict=WRONG; status=1; echo "$out" | grep -E "assert|error|depth" || true; fi
  if [ "$expect" = fail ] && [ "$got" = fail ]; then
    # the counter-example, trimmed to its steps and the final state
    # shellcheck disable=SC2086
    spin -t -p -g -l $defs saga.pml 2>/dev/null | grep -E "^ *[0-9]+:|assertion|^\s+(st|comp|tstat|mails|inflight|seen|inc)\[" | grep -v ":init:" | cut -c1-220 > "trail.txt" || true
    if [ -n "${MODEL_KEEP_TRAILS:-}" ]; then cp trail.txt "$here/trails/$name.txt"; fi
    if [ ! -s "$here/trails/$name.txt" ]; then echo "  no kept trail model/trails/$name.txt"; verdict=WRONG; status=1; fi
  fi
  printf '%-22s expect %-4s got %-4s %10s states %7.1f s  %s\n' "$name" "$expect" "$got" "${states:-?}" "$secs" "$verdict"
done
exit $status
