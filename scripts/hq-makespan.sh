#!/usr/bin/env bash
# HyperQueue on the makespan bench's workload, for a side-by-side with
# `cargo bench -p gpuctl-tests --bench makespan` (docs/benchmarks.md). Not part of CI:
# it needs an `hq` binary (HyperQueue is not on crates.io; build it from its
# repository: `cargo build --release -p hyperqueue --bin hq`).
#
#   scripts/hq-makespan.sh PATH/TO/hq [JOBS] [WORKERS]
#   ORDER=submit scripts/hq-makespan.sh PATH/TO/hq
#   SEED=N scripts/hq-makespan.sh PATH/TO/hq    (the bench's `--seed N` mix; 0 by default)
#
# With ORDER=submit each duration is a job of its own, all submitted before any worker
# starts (HyperQueue has no hold): it then starts them in submit order, as gpuctl does,
# and the release is the first task's start (generous to HyperQueue: its workers'
# start and registration are not counted).
#
# The same 500 `sleep D` durations (the bench's generator), WORKERS workers with 8
# GPUs each (declared: `--resource gpus/nvidia=range(0-7)`), all on this host. The
# workers attach first; the whole mix is then submitted as one job (`--each-line`,
# one GPU per task; each task runs `sleep D` through `bash -c 'exec sleep ...'`, one
# more exec per task than gpuctl's jobs), which is the release. Prints the makespan
# (submit -> last task end, from HQ's own task times), the zero-overhead FIFO bound,
# and per task: start -> end beyond its sleep. Then 40 jobs of `date +%s%6N`, one at a
# time on the idle workers: `hq submit` invoked -> the program's own clock (the latency
# bench's "`gpuctl submit` invoked -> the program's own clock when it ran").
set -euo pipefail
HQ=${1:?usage: $0 PATH/TO/hq [JOBS] [WORKERS]}
JOBS=${2:-500}
WORKERS=${3:-4}
D=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$D"' EXIT
PY=/usr/bin/python3

"$HQ" server start --server-dir "$D/server" >"$D/server.log" 2>&1 &
for _ in $(seq 100); do
  "$HQ" --server-dir "$D/server" server info >/dev/null 2>&1 && break
  sleep 0.1
done
ORDER=${ORDER:-job}
start_workers() {
for w in $(seq "$WORKERS"); do
  "$HQ" worker start --server-dir "$D/server" --cpus 64 --detect-resources none \
    --resource "gpus/nvidia=range(0-7)" >"$D/worker-$w.log" 2>&1 &
done
for _ in $(seq 200); do
  n=$("$HQ" --server-dir "$D/server" worker list --output-mode json | $PY -c 'import json,sys; print(len(json.load(sys.stdin)))')
  [ "$n" = "$WORKERS" ] && break
  sleep 0.1
done
}
[ "$ORDER" = submit ] || start_workers

# The bench's durations (ms), as seconds with three decimals, one per line.
$PY - "$JOBS" "${SEED:-0}" >"$D/durations.txt" <<'EOF'
import sys
n = int(sys.argv[1]); m = (1 << 64) - 1
x = (0x2545F4914F6CDD1D + int(sys.argv[2]) * 0x9E3779B97F4A7C15) & m
for _ in range(n):
    x = (x * 6364136223846793005 + 1442695040888963407) & m
    print("%.3f" % ((1000 + (x >> 33) % 4400) / 1000))
EOF

if [ "$ORDER" = submit ]; then
  # One job a duration, in order, then the workers: the first task's start is the release.
  while read -r d; do
    "$HQ" --server-dir "$D/server" submit --output-mode quiet --cwd "$D" --stdout none \
      --stderr none --resource gpus/nvidia=1 -- bash -c "exec sleep $d" >>"$D/ids.txt"
  done <"$D/durations.txt"
  start_workers
  released=first
  "$HQ" --server-dir "$D/server" job wait all >/dev/null
  "$HQ" --server-dir "$D/server" task list "1-$JOBS" --output-mode json >"$D/tasks.json"
else
  released=$($PY -c 'import time; print(time.time())')
  # Output discarded, as the bench's jobs write to /dev/null.
  id=$("$HQ" --server-dir "$D/server" submit --output-mode quiet --each-line "$D/durations.txt" \
    --cwd "$D" --stdout none --stderr none \
    --resource gpus/nvidia=1 -- bash -c 'exec sleep "$HQ_ENTRY"')
  "$HQ" --server-dir "$D/server" job wait "$id" >/dev/null
  "$HQ" --server-dir "$D/server" task list "$id" --output-mode json >"$D/tasks.json"
fi

$PY - "$D/tasks.json" "$D/durations.txt" "$released" "$((WORKERS * 8))" <<'EOF'
import json, sys
from datetime import datetime
tasks_file, durations_file, released, gpus = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
durations = [float(l) for l in open(durations_file)]
data = json.load(open(tasks_file))
def t(s):
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()
if isinstance(data, dict) and len(data) > 1:
    # One job a duration (ORDER=submit): job N ran duration N; its one task gets that id.
    tasks = [dict(x, id=int(j) - 1) for j, ts in data.items() for x in ts]
else:
    tasks = data[0]["tasks"] if isinstance(data, list) and data and "tasks" in data[0] else data
    if isinstance(tasks, dict):
        tasks = next(iter(tasks.values()))
released = min(t(x["started_at"]) for x in tasks) if released == "first" else float(released)
def list_schedule(order):
    free = [0.0] * gpus
    for d in order:
        i = free.index(min(free))
        free[i] += d
    return max(free)
fifo = list_schedule(durations)
# HyperQueue does not start tasks in submit order: the same list schedule in the order
# it did start them is the zero-overhead bound for its own order.
started = sorted(tasks, key=lambda x: t(x["started_at"]))
own = list_schedule([durations[x["id"]] for x in started])
ends = [t(x["finished_at"]) for x in tasks]
beyond = sorted((t(x["finished_at"]) - t(x["started_at"]) - durations[x["id"]]) * 1000 for x in tasks)
makespan = max(ends) - released
last_start = t(started[-1]["started_at"])
busy = sum(max(0.0, min(t(x["finished_at"]), last_start) - max(t(x["started_at"]), released)) for x in tasks)
q = lambda p: beyond[round((len(beyond) - 1) * p)]
print(f"HyperQueue, {len(tasks)} jobs of `sleep` on {gpus} GPUs:")
print(f"  makespan {makespan:.2f} s; zero-overhead FIFO bound {fifo:.2f} s; the same bound in the order it started them {own:.2f} s; overhead over that {makespan - own:.2f} s ({(makespan / own - 1) * 100:.2f}%)")
print(f"  GPU occupancy while jobs waited (release -> last start, {last_start - released:.1f} s): {busy / (gpus * (last_start - released)) * 100:.2f}%")
print(f"  end - start beyond the sleep (ms): p50 {q(0.5):.0f} / p90 {q(0.9):.0f} / max {q(1.0):.0f}")
EOF

# Submit -> the program running, one job at a time.
$PY - "$HQ" "$D" <<'EOF'
import subprocess, sys, time
hq, d = sys.argv[1], sys.argv[2]
lat = []
for i in range(43):
    out = f"{d}/date-{i}.txt"
    t0 = time.time()
    jid = subprocess.run([hq, "--server-dir", f"{d}/server", "submit", "--output-mode", "quiet",
                          "--cwd", d, "--stdout", out, "--stderr", "none", "--", "date", "+%s%6N"],
                         capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([hq, "--server-dir", f"{d}/server", "job", "wait", jid], capture_output=True, check=True)
    if i >= 3:  # warm-up
        lat.append((int(open(out).read().strip()) - t0 * 1e6) / 1000)
lat.sort()
q = lambda p: lat[round((len(lat) - 1) * p)]
print(f"  `hq submit` invoked -> the program's own clock (ms, 40 jobs): p50 {q(0.5):.1f} / p90 {q(0.9):.1f} / max {q(1.0):.1f}")
EOF
