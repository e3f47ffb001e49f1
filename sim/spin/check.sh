#!/usr/bin/env bash
# Checks the Spin models of guard's lease, fence and slot protocols.
#
# Every positive run must search its whole state space without an error;
# every negative run (a protocol rule removed, or a bound exceeded) must
# end in a violated assertion of the property it names. One line per run:
# name, expected, result, states stored, transitions, search seconds.
#
#   bash sim/spin/check.sh              the quick bounds (about a minute and a half)
#   SPIN_DEEP=1 bash sim/spin/check.sh  adds the deeper bounds (about eight minutes)
#
# Environment: SPIN_DEEP=1 (deeper runs), SPIN_MEMLIM (MB per search,
# default 4096), SPIN_TIMEOUT (seconds per search, default 900),
# SPIN_KEEP=1 (keep the work directory, with each run's pan output and the
# trail of each counterexample, and print where it is).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
deep="${SPIN_DEEP:-0}"
memlim="${SPIN_MEMLIM:-4096}"
limit="${SPIN_TIMEOUT:-900}"

for tool in spin gcc; do
  command -v "$tool" >/dev/null || { echo "check.sh: $tool not found" >&2; exit 2; }
done

work="$(mktemp -d)"
if [[ "${SPIN_KEEP:-0}" == 1 ]]; then
  trap 'echo "work directory kept: $work"' EXIT
else
  trap 'rm -rf "$work"' EXIT
fi

# name, model, expected (holds, or violated:<alternatives of assertion labels>),
# spin -D defines, pan's depth limit
runs=()
run() { runs+=("$1;$2;$3;$4;$5"); }

# Leases (lease.pml): property 1 (and 2b).
run lease                        lease.pml holds               ""                               2000000
run lease-node-skew-only         lease.pml holds               "-DCLOCKD=0 -DNSKEW=2"           2000000
run lease-two-failovers          lease.pml holds               "-DNSKEW=-1 -DNFAULTS=2"         2000000
run lease-no-renew-deadline      lease.pml "violated:P1|P2b"   "-DNO_RENEW_DEADLINE"            2000000
run lease-drift-above-margin     lease.pml "violated:P1"       "-DCLOCKD=2"                     2000000
run lease-skew-above-margin      lease.pml "violated:P1"       "-DNSKEW=2"                      2000000
run lease-lossy-failover         lease.pml "violated:P1"       "-DLOSSY"                        2000000
run lease-release-before-demote  lease.pml "violated:P1"       "-DRELEASE_BEFORE_DEMOTE"        2000000
run lease-key-loss               lease.pml holds               "-DKEYLOSS"                      2000000
run lease-key-loss-no-record     lease.pml "violated:P1"       "-DKEYLOSS -DNO_GRANT_RECORD"    2000000
# Fences (fence.pml): properties 2 and 3.
run fence                        fence.pml holds               ""                               1000000
run fence-node-ahead             fence.pml holds               "-DNSKEW=1"                      1000000
run fence-three-clients          fence.pml holds               "-DNREP=3 -DNFAULTS=3"           1000000
run fence-plain-counter          fence.pml "violated:P3|P2c"   "-DPLAIN_COUNTER"                40
run fence-lag-at-downtime        fence.pml "violated:P3"       "-DNSKEW=-2"                     1000000
run fence-grants-outrun-time     fence.pml "violated:P3"       "-DGPT=3"                        100
run fence-no-fencing             fence.pml "violated:P2a|P2c"  "-DNO_FENCING"                   1000000
# Slots (slots.pml): property 4.
run slots                        slots.pml holds               ""                               100000
run slots-late-and-slow          slots.pml holds               "-DLATE=1 -DLAT=1 -DR=4"         100000
run slots-skew-at-retention      slots.pml "violated:P4"       "-DR=1"                          100000
run slots-lateness-adds-to-skew  slots.pml "violated:P4"       "-DLATE=1 -DLAT=1 -DR=3"         100000
run slots-lost-keys              slots.pml "violated:P4"       "-DLOSE_KEYS"                    100000

if [[ "$deep" == 1 ]]; then
  run deep-lease-3-replicas               lease.pml holds         "-DNREP=3"                                 3000000
  run deep-lease-more-faults              lease.pml holds         "-DNPAUSE=2 -DNDEMOTE=2 -DNFAULTS=2 -DNSKEW=-1" 3000000
  run deep-lease-wider-clocks             lease.pml holds         "-DTTL=7 -DDRIFT=3 -DINTERVAL=2 -DCLOCKD=2 -DNSKEW=1" 3000000
  run deep-lease-wider-clocks-above       lease.pml "violated:P1" "-DTTL=7 -DDRIFT=3 -DINTERVAL=2 -DCLOCKD=3 -DNSKEW=1" 3000000
  run deep-lease-3-replicas-no-deadline   lease.pml "violated:P1|P2b" "-DNREP=3 -DNO_RENEW_DEADLINE"         3000000
  run deep-lease-3-replicas-drift-above   lease.pml "violated:P1" "-DNREP=3 -DCLOCKD=2"                      3000000
  run deep-lease-3-replicas-lossy         lease.pml "violated:P1" "-DNREP=3 -DLOSSY"                         3000000
  run deep-fence                          fence.pml holds         "-DNREP=3 -DNFAULTS=4 -DSCALE=3 -DGPT=3 -DNSKEW=-2 -DDOWN=3" 1000000
  run deep-fence-lag-at-downtime          fence.pml "violated:P3" "-DNREP=3 -DNFAULTS=4 -DSCALE=3 -DGPT=3 -DNSKEW=-3 -DDOWN=3" 1000000
  run deep-fence-plain-counter            fence.pml "violated:P3|P2c" "-DNREP=3 -DNFAULTS=4 -DPLAIN_COUNTER"  40
  run deep-slots-steps                    slots.pml holds         "-DSTEPS -DSKEW=2 -DEARLY=1 -DLATE=2 -DLAT=1 -DTMAX=10 -DR=7" 100000
  run deep-slots-steps-at-bound           slots.pml "violated:P4" "-DSTEPS -DSKEW=2 -DEARLY=1 -DLATE=2 -DLAT=1 -DTMAX=10 -DR=6" 100000
  run deep-slots-long                     slots.pml holds         "-DSKEW=2 -DEARLY=1 -DLATE=2 -DLAT=1 -DP=4 -DTMAX=16 -DR=7" 100000
fi

printf '%-34s %-9s %-15s %12s %13s %9s\n' run expected result states transitions seconds
failures=0
started=$SECONDS

for entry in "${runs[@]}"; do
  IFS=';' read -r name model expect defines depth <<<"$entry"
  dir="$work/$name"
  mkdir -p "$dir"
  cp "$here/$model" "$dir/"
  # shellcheck disable=SC2086 # the defines are separate words
  if ! (cd "$dir" && spin -a $defines "$model" >spin.out 2>&1); then
    printf '%-34s %-9s %-15s\n' "$name" "${expect%%:*}" "SPIN-ERROR"
    sed 's/^/    /' "$dir/spin.out" | head -5
    failures=$((failures + 1))
    continue
  fi
  # Only assertions are checked (monitors, no never claim): -DSAFETY.
  if ! (cd "$dir" && gcc -O2 -w -DSAFETY -DCOLLAPSE -DMEMLIM="$memlim" -o pan pan.c >gcc.out 2>&1); then
    printf '%-34s %-9s %-15s\n' "$name" "${expect%%:*}" "GCC-ERROR"
    sed 's/^/    /' "$dir/gcc.out" | head -5
    failures=$((failures + 1))
    continue
  fi
  status=0
  (cd "$dir" && timeout "$limit" ./pan -m"$depth" >pan.out 2>&1) || status=$?
  out="$dir/pan.out"

  states=$(awk '/states, stored/ { print $1; exit }' "$out")
  trans=$(awk '/transitions \(= stored\+matched\)/ { print $1; exit }' "$out")
  secs=$(awk '/pan: elapsed time/ { print $4; exit }' "$out")
  errors=$(sed -n 's/.*errors: \([0-9][0-9]*\).*/\1/p' "$out" | head -1)
  label=$(grep -m1 'assertion violated' "$out" | grep -oE 'P[0-9][a-z]?_[A-Za-z_]+' | head -1 || true)
  tag="${label%%_*}"
  incomplete=0
  if [[ $status -ne 0 ]] || [[ -z "$errors" ]] ||
     grep -qE 'max search depth too small|Search not completed|reached -DMEMLIM bound|out of memory' "$out"; then
    incomplete=1
  fi

  ok=0
  if [[ "$expect" == holds ]]; then
    if [[ $incomplete -eq 1 ]]; then
      result="INCOMPLETE"
    elif [[ "$errors" == 0 ]]; then
      result="holds"; ok=1
    else
      result="VIOLATED:${tag:-?}"
    fi
  else
    want="${expect#violated:}"
    if [[ -n "$errors" && "$errors" != 0 && -n "$tag" ]]; then
      result="violated:$tag"
      [[ "$tag" =~ ^($want)$ ]] && ok=1
    elif [[ $status -eq 124 ]]; then
      result="TIMEOUT"
    elif [[ -n "$errors" && "$errors" != 0 ]]; then
      result="ERROR"               # an error that is not a labelled assertion
    else
      result="NOT-REFUTED"
    fi
  fi
  [[ $ok -eq 1 ]] || failures=$((failures + 1))
  printf '%-34s %-9s %-15s %12s %13s %9s\n' "$name" "${expect%%:*}" "$result" \
    "${states:--}" "${trans:--}" "${secs:--}"
  if [[ $ok -ne 1 ]]; then
    grep -E 'assertion violated|max search depth|Search not completed|MEMLIM|error' "$out" |
      head -3 | sed 's/^/    /'
  fi
done

echo "total: $((SECONDS - started)) s, ${#runs[@]} runs, $failures failed"
[[ $failures -eq 0 ]]
