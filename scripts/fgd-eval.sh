#!/usr/bin/env bash
# The FGD fragmentation experiment on all 17 workloads of the Alibaba trace, 10 seeds,
# for each packing policy; writes CSVs in the layout of fgd_expected_results/ and a
# markdown table (summary.md) to $OUT (default target/fgd-eval).
#   scripts/fgd-eval.sh [POLICIES]     e.g. scripts/fgd-eval.sh fgd,best-fit
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
trace=${GPUCTL_TRACE_DIR:-$root/../shared/traces/alibaba-gpu-v2023}
out=${OUT:-$root/target/fgd-eval}
policies=${1:-fgd,best-fit,first-fit}
cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p gpuctld -p gpuctl-sim
workloads=(default cpu050 cpu100 cpu200 cpu250 gpushare40 gpushare60 gpushare80 gpushare100
  gpuspec10 gpuspec20 gpuspec25 gpuspec33 multigpu20 multigpu30 multigpu40 multigpu50)
pods=$(printf "$trace/openb_pod_list_%s.csv," "${workloads[@]}")
"$root/target/release/gpuctld" simulate inflation \
  --nodes "$trace/openb_node_list_gpu_node.csv" --pods "${pods%,}" \
  --policy "$policies" --seeds 42-51 --out "$out"
