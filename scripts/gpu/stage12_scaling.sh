#!/usr/bin/env bash
# Stage 12 on a machine with several GPUs (issue 21), in one call: build bench12 and the NCCL
# test, run the NCCL test (the ring over P = 2 and all GPUs equal to the virtual ring, bit for
# bit, and to the reference) and fa_attention.distributed's checks under NCCL (torchrun, one
# process per GPU: scripts/bench/bench_distributed.py --check-only), then time the plain and zigzag rings over P = 1, 2, 4, 8 (as many
# as there are GPUs) for N = 32k … 256k, causal and not, forward and backward, each with
# overlap, with its exchanges serialised, and with no exchange (bench12). The same grid gives
# strong scaling (fixed N) and weak scaling (fixed N/P). Writes into OUT:
#   stage12_scaling.csv  bench12's rows          stage12_tables.md  the notes' tables
#   build.log  nccl_test.log  bench.log  env.txt
#
#   scripts/gpu/stage12_scaling.sh OUT
#   env: FA12_BUDGET_S  seconds for the whole script (default 480): the sweep skips what would
#                       not end in time, largest N last
#        FA12_SEQS      (default 32768,65536,131072,262144)   FA12_HEADS (default 8)
#        FA12_REPS      timed repetitions per mode (default 3)
set -uo pipefail
start=$SECONDS
cd "$(dirname "$0")/../.."
OUT=${1:?usage: scripts/gpu/stage12_scaling.sh OUT}
mkdir -p "$OUT"
BUDGET=${FA12_BUDGET_S:-480}
# NVLink multicast off in every process: it can take the shared host's GPUs out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source scripts/gpu/env.sh  # the CUDA tools on PATH; gpu_configure

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
{ date -u +%FT%TZ; nvidia-smi -L 2>&1; nvidia-smi topo -m 2>&1; env | grep -E '^(NCCL|NVSHMEM|TORCH_SYMM)'; } \
  >"$OUT/env.txt"
echo "stage12: $gpus GPUs; budget ${BUDGET} s"

BUILD=build-gpu
gpu_configure . $BUILD >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
grep -E "stage 12: NCCL" "$OUT/build.log"
cmake --build $BUILD -j "$(nproc)" --target bench12 test_stage12_nccl >>"$OUT/build.log" 2>&1 ||
  { grep -E "error" -A3 "$OUT/build.log" | head -60; exit 1; }
echo "stage12: built at $((SECONDS - start)) s"

timeout 150 $BUILD/tests/test_stage12_nccl 2>&1 | tail -30 | tee "$OUT/nccl_test.log"
echo "stage12: NCCL test exit ${PIPESTATUS[0]} (77: skipped) at $((SECONDS - start)) s"

# fa_attention.distributed under NCCL, one process per GPU: the checks of bench_distributed.py
# (ring and Ulysses, both splits, causal and not, against float64; what tests/test_distributed.py
# checks on gloo in CI), no timing.
if ((gpus >= 2)); then
  cmake --build $BUILD -j "$(nproc)" --target fa_c fa_torch >>"$OUT/build.log" 2>&1 &&
    FA_LIB=$BUILD/stages/libfa_c.so FA_TORCH_LIB=$BUILD/python/libfa_torch.so timeout 150 \
      torchrun --nproc-per-node "$gpus" scripts/bench/bench_distributed.py --check-only \
      --out "$OUT/distributed.csv" 2>&1 | tail -5 | tee -a "$OUT/nccl_test.log"
  echo "stage12: torch.distributed checks exit ${PIPESTATUS[0]} at $((SECONDS - start)) s"
fi

ranks=1
for P in 2 4 8; do ((P <= gpus)) && ranks+=",$P"; done
left=$((BUDGET - (SECONDS - start) - 20))  # 20 s for the tables and a margin
if ((left < 30)); then echo "stage12: no time left for the sweep ($left s)"; exit 1; fi
commit=${FA_COMMIT:-$(cat .git_head 2>/dev/null || git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
transport=nccl
((gpus < 2)) && transport=device  # one GPU: P = 1 only, no NCCL needed
timeout $((left + 60)) $BUILD/stages/12_ring_attention/bench12 --ranks "$ranks" \
  --seq "${FA12_SEQS:-32768,65536,131072,262144}" --split plain,zigzag --causal 0,1 --heads "${FA12_HEADS:-8}" \
  --head-dim 128 --dtype bf16 --transport $transport --reps "${FA12_REPS:-3}" --budget-s "$left" \
  --commit "$commit" --csv "$OUT/stage12_scaling.csv" 2>&1 | tee "$OUT/bench.log"
echo "stage12: bench12 exit ${PIPESTATUS[0]} at $((SECONDS - start)) s"

python3 scripts/results/stage12_tables.py "$OUT/stage12_scaling.csv" >"$OUT/stage12_tables.md" 2>&1 &&
  cat "$OUT/stage12_tables.md"
echo "stage12: done in $((SECONDS - start)) s; commit $OUT/stage12_scaling.csv as docs/results/stage12_scaling.csv"
