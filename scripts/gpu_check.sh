#!/usr/bin/env bash
# One command for a machine with a GPU (CI has none): builds ringdist with its
# CUDA sources against the torch installed there, then runs, each bounded in
# time so the whole fits one 10-minute device call:
#   tests     the shared arithmetic, the CUDA kernels, collectives/hooks/DDP on
#             CUDA tensors with several ranks on the one GPU, the C++ API's ctest
#             suite built against the machine's torch
#   fsdp2     examples/fsdp2_train.py --device cuda, 2 ranks on one GPU: the same-GPU path
#             against the staged path (exact) and gloo on the CPU
#   kernels   benchmarks/cuda_kernels.py (kernels vs D2D copy, pinned copies)
#   example   the torchrun DDP example on CUDA, 2 ranks on one GPU
#   compare   ringdist (same-GPU fused path, IPC buffers, staged) vs gloo on CUDA tensors,
#             2 ranks on one GPU, alternating
#   compare4  the same-GPU path against the IPC buffers with 4 ranks on the GPU
#   collectives  allgather, reduce-scatter, broadcast, alltoall, send/recv on CUDA: same-GPU vs
#             staged vs gloo
#   ddp       the DDP step on CUDA, 2 ranks on the GPU as 2 emulated hosts at 10 Gbit/s
#   ddp1g     the same at 1 Gbit/s
#   staged    allreduce (16-256 MiB), allgather and reduce-scatter (16-64 MiB) across 2
#             emulated hosts at 10 Gbit/s: pipelined staging against unpipelined and gloo
# With a short lease (15 device-minutes, a machine's start included), one call each, fired
# right after the last returns (a machine goes back after 30 s idle), in this order: `tests`
# (on an H200 the build took 48-63 s, 15 s again on the same machine, and the tests 4.6
# minutes), `fsdp2 kernels example` (2.5 minutes), `compare`, `compare4`, `collectives`, `ddp`,
# `staged`, then the rest (`ddp1g` first).
#   nccl      NCCL with 2 ranks on one GPU (its refusal is the record)
#   handoff   benchmarks/gpu_handoff.py: the hand-off between two processes' streams on one
#             GPU (host waits against stream memory operations; issue 31's H)
# Pick stages as arguments (default: all). Results land in ${OUT:-gpu-check}/:
# machine.txt, build.log, tests.log, cuda_kernels.json, compare_cuda.json, compare_cuda_n4.json,
# gpu_handoff.json,
# runs.log.
# Installs into a private folder; nothing of the machine's Python changes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-check}
PY=${PYTHON:-python3}
SITE=${RINGDIST_GPU_SITE:-/tmp/ringdist-site}
STAGES=${*:-tests fsdp2 kernels example compare compare4 collectives ddp ddp1g staged nccl handoff}
mkdir -p "$OUT"
{ nvidia-smi || true; "$PY" -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"; } \
  2>&1 | tee "$OUT/machine.txt"

start=$(date +%s)
# A test build: the tests stage needs the suite's hooks (_C.testing).
export TORCH_RINGDIST_CUDA=1 TORCH_RINGDIST_TESTING=1 MAX_JOBS=${MAX_JOBS:-$(nproc)}
if ! "$PY" -m pip install -q --no-build-isolation --no-deps --upgrade --target "$SITE" . \
    > "$OUT/build.log" 2>&1; then
  tail -30 "$OUT/build.log"; echo "build failed"; exit 1
fi
echo "built in $(( $(date +%s) - start )) s" | tee -a "$OUT/build.log"
# benchmarks/ on the path: `python -P` (no checkout on sys.path, so the built package is
# imported) also leaves out the script's folder, where bench_common lives. torch's lib folder
# for the C++ programs: the package sits apart from torch, so its run path does not find it.
TORCH_LIB=$("$PY" -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))")
export PYTHONPATH="$SITE:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
export LD_LIBRARY_PATH="$TORCH_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
TORCHRUN=("$PY" -m torch.distributed.run --standalone --nproc-per-node 2)

failed=()
stage() {  # stage NAME SECONDS COMMAND...: runs it bounded, appends to runs.log
  local name=$1 limit=$2; shift 2
  echo "==== $name ($(date -u +%FT%TZ))" | tee -a "$OUT/runs.log"
  timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$OUT/runs.log"
  local rc=${PIPESTATUS[0]}
  echo "==== $name exit $rc" | tee -a "$OUT/runs.log"
  [ "$rc" -eq 0 ] || failed+=("$name")
}
for s in $STAGES; do
  case $s in
    tests)
      echo "==== tests" >> "$OUT/runs.log"
      timeout -k 10 400 "$PY" -P -m pytest tests/test_shared_arithmetic.py tests/test_cuda_kernels.py tests/test_doctor.py \
        tests/test_cuda_collectives.py tests/test_cpp.py -q -rs --timeout 300 2>&1 | tee "$OUT/tests.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || failed+=(tests) ;;
    fsdp2)
      stage fsdp2 300 "$PY" -P -m pytest tests/test_fsdp2_example.py -k one_gpu -q -rs --timeout 280 ;;
    kernels)
      stage kernels 120 "$PY" -P benchmarks/cuda_kernels.py --json "$OUT/cuda_kernels.json" ;;
    example)
      stage example 120 "${TORCHRUN[@]}" examples/train_ddp.py --device cuda --epochs 2 --no-progress \
        --hook int8 --hook-option error_feedback=true ;;
    compare)
      # ringdist's same-GPU path (stream-ordered, one fused kernel), its IPC-buffer path
      # (host waits per piece), staged through pinned host memory, and gloo: 2 ranks.
      stage compare 420 "$PY" -P benchmarks/compare.py --backends ringdist ipc=ringdist staged=ringdist gloo \
        --label-env ringdist:RINGDIST_CUDA_FUSED=1 --label-env ipc:RINGDIST_CUDA_IPC_MIN_BYTES=0 \
        --label-env staged:RINGDIST_CUDA_IPC_BYTES=0 --rounds 2 --nproc 2 \
        --min-bytes 4K --max-bytes 256M --sweep-arg=--device=cuda --timeout 100 \
        --out "/tmp/compare_cuda.json"
      cp /tmp/compare_cuda.json "$OUT/" 2>/dev/null ;;
    collectives)
      # allgather and reduce-scatter (tensor forms, what FSDP2 runs), broadcast, alltoall and a
      # send/recv ring, 1-64 MiB: the same-GPU path against the staged path and gloo, 2 ranks
      # on the GPU.
      for c in allgather reduce_scatter broadcast alltoall sendrecv; do
        stage "collectives-$c" 140 "$PY" -P benchmarks/compare.py --backends ringdist staged=ringdist gloo \
          --label-env ringdist:RINGDIST_CUDA_FUSED=1 --label-env staged:RINGDIST_CUDA_IPC_BYTES=0 \
          --rounds 1 --nproc 2 --min-bytes 1M \
          --max-bytes 64M --sweep-arg=--device=cuda --sweep-arg=--collective=$c --timeout 60 \
          --out "/tmp/compare_cuda_$c.json"
        cp "/tmp/compare_cuda_$c.json" "$OUT/" 2>/dev/null
      done ;;
    ddp|ddp1g)
      # The DDP step on CUDA, 2 ranks on the one GPU as two emulated hosts at 10 (ddp) or 1
      # (ddp1g) Gbit/s (network namespaces; needs root and iproute2 there): the staged path
      # across hosts.
      rate=$([ "$s" = ddp ] && echo 10gbit || echo 1gbit)
      stage "$s" 420 "$PY" -P benchmarks/ddp_compare.py --hosts 2 --rate "$rate" --rounds 1 \
        --steps 10 --warmup 5 --step-arg=--device=cuda --timeout 120 \
        --configs gloo=gloo:none ringdist=ringdist:none bf16=ringdist:bf16 int8=ringdist:int8 \
        "delayed+int8=ringdist:delayed:hook=int8" --out "$OUT/ddp_cuda_${rate%bit}.json" ;;
    staged)
      # Allreduce of CUDA tensors across 2 emulated hosts at 10 Gbit/s (network namespaces, as
      # ddp), 16-256 MiB: the copies to and from host memory overlapping the ring (pipelined)
      # against copying before and after it, and gloo; the link's 1.25 GB/s is the bound.
      staged=(--backends ringdist unpipelined=ringdist gloo --hosts 2 --rate 10gbit --rounds 1
              --label-env unpipelined:RINGDIST_CUDA_PIPELINE_BYTES=0 --min-bytes 16M
              --sweep-arg=--device=cuda --timeout 120)
      stage staged 240 "$PY" -P benchmarks/compare.py "${staged[@]}" --max-bytes 256M \
        --out "/tmp/compare_cuda_staged.json"
      # FSDP2's two collectives across hosts, the same way
      for c in allgather reduce_scatter; do
        stage "staged-$c" 150 "$PY" -P benchmarks/compare.py "${staged[@]}" --collective "$c" \
          --max-bytes 64M --out "/tmp/compare_cuda_staged_$c.json"
      done
      cp /tmp/compare_cuda_staged*.json "$OUT/" 2>/dev/null ;;
    compare4)
      # The same with 4 ranks on the GPU (the 2·P·S bound's second row), fused against IPC.
      stage compare4 300 "$PY" -P benchmarks/compare.py --backends ringdist ipc=ringdist --baseline ipc \
        --label-env ringdist:RINGDIST_CUDA_FUSED=1 --label-env ipc:RINGDIST_CUDA_IPC_MIN_BYTES=0 \
        --rounds 2 --nproc 4 --min-bytes 4K --max-bytes 256M --sweep-arg=--device=cuda \
        --timeout 120 --out "/tmp/compare_cuda_n4.json"
      cp /tmp/compare_cuda_n4.json "$OUT/" 2>/dev/null ;;
    nccl)
      # Expected to fail: NCCL takes one GPU per rank. The message is the record.
      stage nccl 60 "${TORCHRUN[@]}" benchmarks/sweep.py --backend nccl --device cuda \
        --max-bytes 1M --timeout 30
      failed=("${failed[@]/nccl}") ;;
    handoff)
      stage handoff 120 "$PY" -P benchmarks/gpu_handoff.py --iters 2000 --timeout 100 \
        --json "$OUT/gpu_handoff.json" ;;
    *) echo "unknown stage $s"; exit 2 ;;
  esac
done
echo "stages: $STAGES; failed: ${failed[*]:-none}"
[ -z "$(echo "${failed[*]:-}" | tr -d ' ')" ]
