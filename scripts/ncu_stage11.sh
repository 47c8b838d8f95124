#!/usr/bin/env bash
# Profile stage 11's backward kernels (steps 11b, 11c) with Nsight Compute beside cuDNN's
# backward (through PyTorch's SDPA) on the same shape: tensor-pipe and shared-memory
# utilization, warp stall reasons, bank conflicts.
#
#   scripts/ncu_stage11.sh BUILD OUT [d] [N]      (GPU machine; default d = 128, N = 4096)
#
# BUILD holds stage11 (scripts/gpu_stage11.sh builds it in build-gpu). The clocks are left
# alone (--clock-control none). Writes OUT/ncu_<what>.txt.
set -euo pipefail
BUILD=$1 OUT=$2 D=${3:-128} N=${4:-4096}
B=$((16384 / N)) H=$((2048 / D))
for dir in /usr/local/cuda/bin; do [[ -d $dir ]] && PATH=$PATH:$dir; done
sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
          --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SchedulerStats
          --section Occupancy --section LaunchStats --section InstructionStats)
ncu_run() {  # ncu_run NAME KERNEL_REGEX COUNT -- command...
  local name=$1 regex=$2 count=$3; shift 4
  timeout -k 5 150 ncu --clock-control none "${sections[@]}" -k "regex:$regex" -c "$count" \
    --launch-skip 1 "$@" >"$OUT/ncu_$name.txt" 2>&1 || echo "ncu $name: rc $?" >>"$OUT/ncu_$name.txt"
}
shape=(--batch "$B" --heads "$H" --kv-heads "$H" --seq-q "$N" --seq-k "$N" --head-dim "$D" --dtype bf16 --no-check
       --bench --repeat 2 --backward)
for step in 11b 11c; do
  ncu_run "stage$step" "bwd_$step" 1 -- "$BUILD/stages/11_hopper_bwd/stage11" "${shape[@]}" --step "$step"
done
cat >"$OUT/sdpa_cudnn.py" <<PY
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
q, k, v, do = (torch.randn($B, $H, $N, $D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
for t in (q, k, v): t.requires_grad_(True)
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    for _ in range(3):
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        o.backward(do)
torch.cuda.synchronize()
PY
# cuDNN's kernels have generated names; profile every launch after the first forward and
# keep the longest one, the backward's main kernel, when reading the file.
ncu_run cudnn "." 6 -- python3 "$OUT/sdpa_cudnn.py"
rm -f "$OUT/sdpa_cudnn.py"
