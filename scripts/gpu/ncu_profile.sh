#!/usr/bin/env bash
# Profile one launch of each tensor-core kernel of a stage with Nsight Compute, next to
# PyTorch's kernels on the same shape: where the time goes (tensor pipe, issue slots,
# shared-memory wavefronts and bank conflicts, warp stall reasons).
#
#   scripts/gpu/ncu_profile.sh [--stage 11] BUILD OUT [d] [N]   (GPU machine; default d = 128, N = 4096)
#
#   (default)   stage 08's forward (at d = 128 each tile, q_regs and q_smem_wide) and stage 09's
#               backward, beside FlashAttention-2 (SDPA's flash backend), forward and backward
#   --stage 11  stage 11's backward, steps 11c and 11d (the default), beside cuDNN's (SDPA's
#               cuDNN backend)
#   env FA_NCU_CAUSAL=1: the causal mask on both sides (default: none)
#
# BUILD holds the stage programs (scripts/gpu/check.sh builds them in build-gpu,
# scripts/gpu/stage_loop.sh 11 builds stage11). The clocks are left alone (--clock-control
# none): the GPU's settings are never changed. Writes OUT/ncu_<what>.txt, one file per kernel
# variant profiled (at most 5).
set -euo pipefail
STAGE=08,09
if [[ ${1:-} == --stage ]]; then STAGE=$2; shift 2; fi
BUILD=$1 OUT=$2 D=${3:-128} N=${4:-4096}
B=$((16384 / N)) H=$((2048 / D))
CAUSAL=${FA_NCU_CAUSAL:-0}
causal_flag=(); [[ $CAUSAL == 1 ]] && causal_flag=(--causal)
is_causal=False; [[ $CAUSAL == 1 ]] && is_causal=True
for dir in /usr/local/cuda/bin; do [[ -d $dir ]] && PATH=$PATH:$dir; done
sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
          --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SchedulerStats
          --section Occupancy --section LaunchStats --section InstructionStats)
ncu_run() {  # ncu_run NAME KERNEL_REGEX COUNT -- command...
  local name=$1 regex=$2 count=$3; shift 4
  timeout -k 5 150 ncu --clock-control none "${sections[@]}" -k "regex:$regex" -c "$count" \
    --launch-skip 1 "$@" >"$OUT/ncu_$name.txt" 2>&1 || echo "ncu $name: rc $?" >>"$OUT/ncu_$name.txt"
}
sdpa_run() {  # sdpa_run NAME BACKEND KERNEL_REGEX COUNT: SDPA's BACKEND, three forwards and backwards
  local name=$1 backend=$2 regex=$3 count=$4
  cat >"$OUT/sdpa_$name.py" <<PY
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
q, k, v, do = (torch.randn($B, $H, $N, $D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
for t in (q, k, v): t.requires_grad_(True)
with sdpa_kernel(SDPBackend.$backend):
    for _ in range(3):
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=$is_causal)
        o.backward(do)
torch.cuda.synchronize()
PY
  ncu_run "$name" "$regex" "$count" -- python3 "$OUT/sdpa_$name.py"
  rm -f "$OUT/sdpa_$name.py"
}
shape=(--batch "$B" --heads "$H" --kv-heads "$H" --seq-q "$N" --seq-k "$N" --head-dim "$D" --dtype bf16 --no-check --bench --repeat 2
       ${causal_flag[@]+"${causal_flag[@]}"})
case $STAGE in
  08,09)
    tiles=(q_regs); [[ $D == 128 ]] && tiles=(q_regs q_smem_wide)
    for tile in "${tiles[@]}"; do
      extra=(); [[ $D == 128 ]] && extra=(--tile-d128 "$tile")
      ncu_run "fwd_stage08_$tile" flash_forward_kernel 1 -- "$BUILD/stages/08_tensor_core_fwd/stage08" "${shape[@]}" "${extra[@]}"
    done
    ncu_run bwd_stage09 dkdv_kernel 1 -- "$BUILD/stages/09_tensor_core_bwd/stage09" "${shape[@]}" --backward
    sdpa_run fa2 FLASH_ATTENTION "flash_fwd_kernel|flash_bwd_dq_dk_dv" 2 ;;
  11)
    for step in 11c 11d; do
      ncu_run "stage$step" "bwd_$step" 1 -- "$BUILD/stages/11_hopper_bwd/stage11" "${shape[@]}" --backward --step "$step"
    done
    # cuDNN's kernels have generated names: every launch after the first forward is profiled;
    # the longest one in the file is the backward's main kernel.
    sdpa_run cudnn CUDNN_ATTENTION "." 6 ;;
  *) echo "ncu_profile.sh: --stage takes 11 (without it: stages 08 and 09; got '$STAGE')" >&2; exit 2 ;;
esac
