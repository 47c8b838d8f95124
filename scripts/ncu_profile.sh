#!/usr/bin/env bash
# Profile one launch of each tensor-core kernel with Nsight Compute, next to the kernels of
# PyTorch's FlashAttention-2 backend on the same shape: where the time goes (tensor pipe,
# issue slots, shared-memory wavefronts and bank conflicts, warp stall reasons).
#
#   scripts/ncu_profile.sh BUILD OUT [d] [N]      (GPU machine; default d = 128, N = 4096)
#
# BUILD holds stage08 and stage09 (scripts/gpu_check.sh builds them in build-gpu). The
# clocks are left alone (--clock-control none): the GPU's settings are never changed.
# Writes OUT/ncu_<what>.txt, one file per kernel variant profiled (at most 5).
set -euo pipefail
BUILD=$1 OUT=$2 D=${3:-128} N=${4:-4096}
B=$((16384 / N)) H=$((2048 / D))
for dir in /usr/local/cuda/bin; do [[ -d $dir ]] && PATH=$PATH:$dir; done
sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
          --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SchedulerStats
          --section Occupancy --section LaunchStats --section InstructionStats)
ncu_run() {  # ncu_run NAME KERNEL_REGEX COUNT -- command...
  local name=$1 regex=$2 count=$3; shift 4
  timeout -k 5 120 ncu --clock-control none "${sections[@]}" -k "regex:$regex" -c "$count" \
    --launch-skip 1 "$@" >"$OUT/ncu_$name.txt" 2>&1 || echo "ncu $name: rc $?" >>"$OUT/ncu_$name.txt"
}
shape=(--batch "$B" --heads "$H" --kv-heads "$H" --seq-q "$N" --seq-k "$N" --head-dim "$D" --dtype bf16 --no-check --bench --repeat 2)
tiles=(q_regs); [[ $D == 128 ]] && tiles=(q_regs q_smem_wide)
for tile in "${tiles[@]}"; do
  extra=(); [[ $D == 128 ]] && extra=(--tile-d128 "$tile")
  ncu_run "fwd_stage08_$tile" flash_forward_kernel 1 -- "$BUILD/stages/08_tensor_core_fwd/stage08" "${shape[@]}" "${extra[@]}"
done
ncu_run bwd_stage09 dkdv_kernel 1 -- "$BUILD/stages/09_tensor_core_bwd/stage09" "${shape[@]}" --backward
cat >"$OUT/sdpa_flash.py" <<PY
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
q, k, v, do = (torch.randn($B, $H, $N, $D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
for t in (q, k, v): t.requires_grad_(True)
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    for _ in range(3):
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        o.backward(do)
torch.cuda.synchronize()
PY
ncu_run fa2 "flash_fwd_kernel|flash_bwd_dq_dk_dv" 2 -- python3 "$OUT/sdpa_flash.py"
rm -f "$OUT/sdpa_flash.py"
