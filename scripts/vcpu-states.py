#!/usr/bin/env python3
"""Where restored guests spend their first seconds: a diagnostic for `bench cluster`.

    scripts/vcpu-states.py record OUT.jsonl &     # as root, beside the benchmark
    rebound bench cluster --json ... > BENCH.json
    kill %1
    scripts/vcpu-states.py summary OUT.jsonl BENCH.json

`record` samples every QEMU process every 50 ms: each thread's run time and run-queue
wait (/proc/PID/task/TID/schedstat) and state (R, S, D), the process's major faults
and bytes read from storage. `summary` takes, for each restore of the benchmark's
JSON, the restored QEMUs (their RAM is a snapshot's `ram-ram.img`), picks each one's
vCPU thread (the thread with the most run time: one vCPU per guest) and prints, per
second after the first VM started, the share of samples its vCPU spent in
uninterruptible sleep (D: waiting for a page fault's read) over all VMs, then per VM
and second: run time, run-queue wait, D share, major faults and MiB read.
"""
import bisect
import json
import os
import re
import sys
import time


def qemus():
    out = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            cmd = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"qemu-system-x86_64"):
            out[int(p)] = " ".join(x.decode(errors="replace") for x in cmd)
    return out


def record(path):
    out = open(path, "w")
    procs, last_scan, seen = {}, 0.0, set()
    while True:
        now = time.time()
        if now - last_scan > 0.5:
            procs, last_scan = qemus(), now
        rec = {"t": now, "procs": {}}
        for pid, cmd in procs.items():
            try:
                st = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
                io = dict(l.split(": ") for l in open(f"/proc/{pid}/io").read().splitlines() if l)
                threads = {}
                for tid in os.listdir(f"/proc/{pid}/task"):
                    ss = open(f"/proc/{pid}/task/{tid}/schedstat").read().split()
                    ts = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
                    threads[tid] = [int(ss[0]), int(ss[1]), ts[0]]
            except (OSError, KeyError, IndexError):
                continue
            m = re.search(r"/(vm[^/]*)/ram-ram\.img", cmd)
            rec["procs"][pid] = {
                "vm": m.group(1) if m else None,
                "majflt": int(st[9]),
                "read_bytes": int(io["read_bytes"]),
                "threads": threads,
            }
        out.write(json.dumps(rec) + "\n")
        out.flush()
        time.sleep(max(0.0, 0.05 - (time.time() - now)))


def summary(path, bench):
    samples = [json.loads(l) for l in open(path)]
    ts = [s["t"] for s in samples]

    def at(t):
        return samples[min(bisect.bisect_left(ts, t), len(samples) - 1)]

    d = json.load(open(bench))
    for topo in d["topologies"]:
        for run in topo["runs"]:
            began = run["outcome"]["report"]["began_unix_ns"] / 1e9
            starts = {v["vm"]: began + v["restore_latency_s"] for v in run["vms"]}
            t0 = min(starts.values())
            # This restore's QEMUs: restored from the snapshot, alive a second in.
            pids = {p: x["vm"] for p, x in at(t0 + 1)["procs"].items() if x["vm"] in starts}
            vcpu = {}
            for p in pids:
                last = at(t0 + 6)["procs"].get(p) or at(t0 + 1)["procs"][p]
                vcpu[p] = max(last["threads"], key=lambda t: last["threads"][t][0])
            shares = []
            for s in range(3):
                i0, i1 = bisect.bisect_left(ts, t0 + s), bisect.bisect_left(ts, t0 + s + 1)
                n = dn = 0
                for i in range(i0, i1):
                    for p in pids:
                        th = samples[i]["procs"].get(p, {}).get("threads", {}).get(vcpu[p])
                        if th:
                            n += 1
                            dn += th[2] == "D"
                shares.append(round(dn / max(n, 1), 2))
            print(f"{topo['topology']} {run['variant']}: false alarms {run['summary']['false_alarms']}, "
                  f"vCPUs in D per second after the first start {shares}")
            for p, vm in sorted(pids.items(), key=lambda x: x[1]):
                row = []
                for s in range(3):
                    a, b = at(starts[vm] + s)["procs"].get(p), at(starts[vm] + s + 1)["procs"].get(p)
                    if not a or not b:
                        continue
                    ta, tb = a["threads"].get(vcpu[p], [0, 0, ""]), b["threads"][vcpu[p]]
                    i0, i1 = bisect.bisect_left(ts, starts[vm] + s), bisect.bisect_left(ts, starts[vm] + s + 1)
                    dn = sum(samples[i]["procs"].get(p, {}).get("threads", {}).get(vcpu[p], [0, 0, ""])[2] == "D"
                             for i in range(i0, i1))
                    row.append(f"run {(tb[0] - ta[0]) / 1e9:.2f} wait {(tb[1] - ta[1]) / 1e9:.2f} "
                               f"D {dn / max(i1 - i0, 1):.2f} faults {b['majflt'] - a['majflt']} "
                               f"{(b['read_bytes'] - a['read_bytes']) / 2**20:.0f} MiB")
                print(f"  {vm}: " + " | ".join(row))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "record":
        record(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "summary":
        summary(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
