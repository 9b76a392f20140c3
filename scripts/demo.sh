#!/usr/bin/env bash
# `make demo`: boot the default guest with the web workload, fetch a page from it,
# print the VM's status, stop it. (The crash-recovery demo replaces this once it exists.)
set -euo pipefail
cd "$(dirname "$0")/.."
REB=target/release/rebound
VM=${DEMO_VM:-demo}
if $REB vm status "$VM" >/dev/null 2>&1; then $REB vm kill "$VM" >/dev/null; fi
echo "== rebound vm start $VM --workload web"
$REB vm start "$VM" --workload web --memory 256M
port=$($REB vm status "$VM" --json | python3 -c '
import json,sys
s=json.load(sys.stdin)
print(next(f["host"] for f in s["forwards"] if f.get("service")=="web" or f["guest"]==8080))')
echo "== curl http://127.0.0.1:$port/"
curl -fsS "http://127.0.0.1:$port/"
echo "== rebound vm status $VM"
$REB vm status "$VM"
echo "== rebound vm stop $VM"
$REB vm stop "$VM"
