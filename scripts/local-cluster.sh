#!/usr/bin/env bash
# Starts a complete single-host gpuctl cluster (gpuctld + one gpud) in a temp dir, runs
# examples/hello.toml (or the job file given), shows the queue and the job's output, then
# stops the cluster. NVML GPUs when the driver is present, fake GPUs otherwise.
#
#   scripts/local-cluster.sh [JOB.toml]      KEEP=1 leaves the cluster running.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
job=${1:-$root/examples/hello.toml}
job=$(cd "$(dirname "$job")" && pwd)/$(basename "$job")

echo "==> building gpuctl, gpuctld, gpud (the first build compiles about 300 crates: several minutes; later ones take seconds)"
cargo build --manifest-path "$root/Cargo.toml" -p gpuctl -p gpuctld -p gpud
bin=$root/target/debug
work=$(mktemp -d -t gpuctl-local.XXXXXX)
port=${GPUCTL_PORT:-7817}
# Users talk to the controller over its Unix socket (identified by uid); the agent joins
# over TLS with a single-use token (the cluster CA pinned by its fingerprint) and uses
# the certificate it gets from then on.
export GPUCTL_CONTROLLER=unix:$work/gpuctld.sock

# The temp dir goes with the cluster; after a failure it stays, with the logs.
cleanup() {
  status=$?
  if [ -z "${KEEP:-}" ]; then
    kill "${gpud_pid:-}" "${ctld_pid:-}" 2>/dev/null || true
    wait 2>/dev/null || true
    if [ "$status" = 0 ]; then
      rm -rf "$work"
    else
      echo "==> failed: state and logs kept in $work" >&2
    fi
  fi
}
trap cleanup EXIT

"$bin/gpuctld" --listen "127.0.0.1:$port" --socket "$work/gpuctld.sock" --state-dir "$work/ctld" \
  >"$work/gpuctld.out" 2>"$work/gpuctld.log" &
ctld_pid=$!
for _ in $(seq 100); do
  [ -S "$work/gpuctld.sock" ] && [ -f "$work/ctld/ca.pem" ] && break
  kill -0 "$ctld_pid" 2>/dev/null || { echo "gpuctld failed:"; cat "$work/gpuctld.log"; exit 1; }
  sleep 0.1
done

if "$bin/gpud" --list-gpus >"$work/gpus.txt" 2>"$work/nvml.txt"; then
  echo "==> NVML found $(wc -l <"$work/gpus.txt") GPU(s): using real GPUs"
  gpu_args=()
else
  echo "==> no NVML here ($(head -c 120 "$work/nvml.txt" | tr '\n' ' ')...): using 4 fake A100-80GB GPUs"
  gpu_args=(--fake-gpus 4xA100-80GB)
fi
node=$(hostname)
# The token stays off every command line (others could read it from /proc): a file
# only root can read, which gpud checks.
(umask 077; "$bin/gpuctl" admin join-token create --node "$node" --ttl 10m --json >"$work/join.json")
"$bin/gpud" --controller "https://127.0.0.1:$port" --join-file "$work/join.json" \
  --name "$node" --state-dir "$work/gpud" --allow-root-jobs "${gpu_args[@]}" 2>"$work/gpud.log" &
gpud_pid=$!

for _ in $(seq 100); do
  "$bin/gpuctl" nodes 2>/dev/null | grep -qE "IDLE|MIXED|ALLOCATED" && break
  sleep 0.1
done
echo "==> cluster up (state and logs in $work, removed at the end unless KEEP=1)"
"$bin/gpuctl" nodes
cd "$work"
id=$("$bin/gpuctl" submit --json "$job" | sed -n 's/.*"job_id": *\([0-9]*\).*/\1/p')
echo "==> submitted $job as job $id"
sleep 0.5
"$bin/gpuctl" queue
while "$bin/gpuctl" queue --json | grep -q "\"id\":$id,"; do sleep 0.3; done
echo "==> job $id finished"
"$bin/gpuctl" queue --all
"$bin/gpuctl" show "$id"
out=$("$bin/gpuctl" show --json "$id" | sed -n 's/.*"stdout": *"\([^"]*\)".*/\1/p' | sed "s/%j/$id/g")
echo "==> output ($work/$out):"
cat "$work/$out"
if [ -n "${KEEP:-}" ]; then
  echo "==> KEEP=1: cluster still running (gpuctld pid $ctld_pid, gpud pid $gpud_pid); GPUCTL_CONTROLLER=$GPUCTL_CONTROLLER"
fi
