#!/usr/bin/env bash
# The checks that need NVIDIA hardware (run as root on a machine with a GPU and its
# driver; the device machine of a task that is lent one). On the real binaries built
# beforehand (cargo build --release -p gpuctl -p gpuctld -p gpud):
#   1. NVML discovery: gpud --list-gpus.
#   2. Power caps by window: a window open all day caps every GPU at 80% of its
#      default limit; nvidia-smi must read it; the cap is lifted by a reconfigure
#      without the window, and the default must come back.
#   3. MPS: two half-GPU share jobs run at once under the GPU's MPS daemon.
#   4. Dynamic MIG (where the GPU offers MIG): gpud --mig dynamic; a job asking a
#      1g instance runs on one the controller had created for it; then a whole-GPU
#      job runs once the GPU is whole again.
# Prints PASS/FAIL per check and exits non-zero on any failure. Leaves the GPUs at their
# default power limit and MIG off, as it found them where it can.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${GPUCTL_BIN:-target/release}
WORK=$(mktemp -d /tmp/gpu-check.XXXXXX)
FAILED=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; FAILED=1; }
cleanup() {
  kill "${GPUD:-}" "${CTLD:-}" 2>/dev/null
  wait 2>/dev/null
  nvidia-smi -mig 0 >/dev/null 2>&1 || true
}
trap cleanup EXIT

if ! command -v nvidia-smi >/dev/null; then echo "no nvidia-smi: not an NVIDIA machine"; exit 2; fi
nvidia-smi -L

# 1. Discovery.
if "$BIN/gpud" --list-gpus >"$WORK/list" 2>&1; then pass "gpud --list-gpus: $(wc -l <"$WORK/list") line(s)"; else fail "gpud --list-gpus: $(cat "$WORK/list")"; fi

PORT=${GPUCTL_CHECK_PORT:-27890}
cat >"$WORK/ctld.toml" <<EOF
[mig]
min_layout_age = "1s"
[windows.always]
days = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
start = "00:00"
end = "23:59"
gpu_power_limit = "80%"
EOF
export GPUCTL_CONTROLLER="unix:$WORK/gpuctld.sock"
"$BIN/gpuctld" --config "$WORK/ctld.toml" --state-dir "$WORK/ctld" --listen "127.0.0.1:$PORT" \
  --socket "$WORK/gpuctld.sock" >"$WORK/ctld.log" 2>&1 &
CTLD=$!
for _ in $(seq 100); do [ -S "$WORK/gpuctld.sock" ] && [ -f "$WORK/ctld/ca.pem" ] && break; sleep 0.1; done
MIG=static
if nvidia-smi --query-gpu=mig.mode.current --format=csv,noheader 2>/dev/null | grep -qvi "N/A"; then MIG=dynamic; fi
(umask 077; "$BIN/gpuctl" admin join-token create --node check --ttl 10m --json >"$WORK/join.json")
"$BIN/gpud" --name check --controller "https://127.0.0.1:$PORT" --join-file "$WORK/join.json" \
  --state-dir "$WORK/gpud" --heartbeat-interval 1s --allow-root-jobs --mig "$MIG" \
  >"$WORK/gpud.log" 2>&1 &
GPUD=$!

# 2. Power caps.
want_limits() {  # every GPU's enforced limit within 1 W of $1 x its default
  nvidia-smi --query-gpu=power.default_limit,enforced.power.limit --format=csv,noheader,nounits |
    awk -F, -v f="$1" '{ d=$1*f; if ($2 < d-1 || $2 > d+1) bad=1 } END { exit bad }'
}
ok=0; for _ in $(seq 30); do if want_limits 0.8; then ok=1; break; fi; sleep 1; done
if [ $ok = 1 ]; then pass "window cap: every GPU at 80% of its default limit"; else fail "window cap not applied: $(nvidia-smi --query-gpu=enforced.power.limit --format=csv,noheader)"; fi
sed -i '/^\[windows.always\]/,$d' "$WORK/ctld.toml"
"$BIN/gpuctl" admin reconfigure >/dev/null 2>&1 || kill -HUP "$CTLD"
ok=0; for _ in $(seq 30); do if want_limits 1.0; then ok=1; break; fi; sleep 1; done
if [ $ok = 1 ]; then pass "cap lifted: every GPU back at its default limit"; else fail "cap not lifted"; fi

# 3. MPS for shares: two half-GPU jobs on one GPU, each under the GPU's MPS daemon.
wait_done() {  # job id -> 0 when COMPLETED within 90 s
  for _ in $(seq 90); do
    s=$("$BIN/gpuctl" show --json "$1" | sed -n 's/.*"state": *"\([A-Z_]*\)".*/\1/p' | head -1)
    [ "$s" = COMPLETED ] && return 0; [ "$s" = FAILED ] && return 1; sleep 1
  done; return 1
}
if command -v nvidia-cuda-mps-control >/dev/null && [ "$MIG" = static ]; then
  printf 'script = "echo pipe=$CUDA_MPS_PIPE_DIRECTORY; nvidia-smi -L; sleep 5"\n[resources]\ngpus = 0.5\n' >"$WORK/half.toml"
  a=$("$BIN/gpuctl" submit --json "$WORK/half.toml" | sed -n 's/.*"job_id": *\([0-9]*\).*/\1/p')
  b=$("$BIN/gpuctl" submit --json "$WORK/half.toml" | sed -n 's/.*"job_id": *\([0-9]*\).*/\1/p')
  sleep 3
  if pgrep -f nvidia-cuda-mps-server >/dev/null || pgrep -f nvidia-cuda-mps-control >/dev/null; then mps=1; else mps=0; fi
  if wait_done "$a" && wait_done "$b" && [ $mps = 1 ]; then pass "MPS: two half-GPU jobs ran under the GPU's MPS daemon"; else fail "MPS: jobs $a $b, daemon seen: $mps"; fi
else
  echo "SKIP: MPS (no nvidia-cuda-mps-control, or a MIG GPU)"
fi

# 4. Dynamic MIG.
if [ "$MIG" = dynamic ]; then
  PROFILE=$(nvidia-smi mig -lgip 2>/dev/null | grep -o '1g\.[0-9]*gb' | head -1)
  printf 'script = "nvidia-smi -L"\n[resources]\nmig = "%s"\n' "$PROFILE" >"$WORK/small.toml"
  id=$("$BIN/gpuctl" submit --json "$WORK/small.toml" | sed -n 's/.*"job_id": *\([0-9]*\).*/\1/p')
  ok=0; for _ in $(seq 90); do
    s=$("$BIN/gpuctl" show --json "$id" | sed -n 's/.*"state": *"\([A-Z_]*\)".*/\1/p' | head -1)
    [ "$s" = COMPLETED ] && ok=1 && break; [ "$s" = FAILED ] && break; sleep 1
  done
  if [ $ok = 1 ]; then pass "dynamic MIG: a $PROFILE job ran on an instance made for it"; else fail "dynamic MIG job $id: $s; $(grep -i mig "$WORK/gpud.log" | tail -3)"; fi
  printf 'script = "nvidia-smi -L"\n[resources]\ngpus = 1\n' >"$WORK/whole.toml"
  id=$("$BIN/gpuctl" submit --json "$WORK/whole.toml" | sed -n 's/.*"job_id": *\([0-9]*\).*/\1/p')
  ok=0; for _ in $(seq 90); do
    s=$("$BIN/gpuctl" show --json "$id" | sed -n 's/.*"state": *"\([A-Z_]*\)".*/\1/p' | head -1)
    [ "$s" = COMPLETED ] && ok=1 && break; sleep 1
  done
  if [ $ok = 1 ]; then pass "dynamic MIG: a whole-GPU job ran after the GPU went back to whole"; else fail "whole job $id: $s"; fi
else
  echo "SKIP: dynamic MIG (no MIG-capable GPU)"
fi
exit $FAILED
