#!/usr/bin/env bash
# `make demo`: the crash demo. A web guest under a client's load panics twice: once
# with the sequential baseline (dump, then recover) and once with the dump overlapped
# with recovery. Prints both downtimes, checks the dump with `crash --osrelease`, and
# leaves the dump and a plot of both VMs' memory in ./demo-out/.
set -euo pipefail
cd "$(dirname "$0")/.."
REB=target/release/rebound
VM=${DEMO_VM:-demo}
OUT=${DEMO_OUT:-demo-out}
MEM=${DEMO_MEMORY:-512M}
# The dump is held to 20 MB/s, as on a slow or busy disk (the recovery VM's disk to
# 1 GB/s): with this small guest that makes the dump last longer than a boot, the case
# the overlap wins.
POLICY=(--io-policy 20:1000 --chunk 16M --filter free)
mkdir -p "$OUT"

cleanup() { $REB vm kill "$VM" >/dev/null 2>&1 || true; $REB vm rm "$VM" >/dev/null 2>&1 || true; }

port_of() {
  $REB vm status "$1" --json | python3 -c '
import json,sys
s=json.load(sys.stdin)
print(next(f["host"] for f in s["forwards"] if f["guest"]==8080))'
}

# A client that fetches the page every 100 ms, as the service's load
# (`rebound bench crash` measures the gaps such a client sees).
client() {
  local port=$1 stopfile=$2
  while [ ! -e "$stopfile" ]; do
    curl -fsS -m 1 "http://127.0.0.1:$port/" >/dev/null 2>&1 || true
    sleep 0.1
  done
}

run() { # run POLICY-NAME: boots, loads, crashes, waits for the service; prints the downtime
  local policy=$1
  cleanup
  echo "== rebound vm start $VM --workload web --memory $MEM --on-crash $policy ${POLICY[*]}" >&2
  $REB vm start "$VM" --workload web --memory "$MEM" --on-crash "$policy" "${POLICY[@]}" >/dev/null
  local port stop
  port=$(port_of "$VM"); stop=$(mktemp -u)
  client "$port" "$stop" &
  local cpid=$!
  sleep 2
  echo "== rebound vm crash $VM   (the guest kernel panics)" >&2
  $REB vm crash "$VM" >/dev/null
  # The service is back when the crash report has a downtime; the dump may still run.
  local t=0
  until $REB crash report "$VM" --json 2>/dev/null | python3 -c 'import json,sys; r=json.load(sys.stdin); sys.exit(0 if r["phase"]=="done" else 1)' 2>/dev/null; do
    sleep 0.5; t=$((t+1)); [ $t -lt 360 ] || { echo "demo: the crash was not handled in 3 minutes" >&2; exit 1; }
  done
  touch "$stop"; wait $cpid || true; rm -f "$stop"
  $REB crash report "$VM" --plot "$OUT/$policy.svg" >&2
  $REB crash report "$VM" --json
}

seq_json=$(run dump-then-recover)
par_json=$(run dump-and-recover)
accel=$($REB vm status "$VM" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["accel"])')
python3 - "$seq_json" "$par_json" "$accel" <<'PY'
import json, sys
s, p, accel = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
print()
print(f"accelerator: {accel}; the dump held to 20 MB/s")
print("                      downtime   dump")
print(f"dump, then recover    {s['downtime_s']:6.2f} s  {s['dump_s']:5.2f} s")
print(f"dump and recover      {p['downtime_s']:6.2f} s  {p['dump_s']:5.2f} s")
print(f"downtime ratio        {s['downtime_s']/p['downtime_s']:.2f}x shorter overlapped")
PY
dump=$($REB crash report "$VM" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["dump_path"])')
cp "$dump" "$OUT/vmcore"
echo "== crash --osrelease $OUT/vmcore"
crash --osrelease "$OUT/vmcore"
echo "== left in $OUT/: vmcore, dump-then-recover.svg, dump-and-recover.svg"
cleanup
