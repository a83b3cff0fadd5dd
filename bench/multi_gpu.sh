#!/usr/bin/env bash
# Issue 18's runs in one command, on a machine with 2 GPUs of one host (one process per GPU, launched by
# `python -m flambeau.distributed.run`; PyTorch's peer by `python -m torch.distributed.run`):
#   (a) every NCCL collective at world size 2 (and 1) vs NumPy references, functional collectives eager and
#       compiled, async handles (pytest; the cuda configurations skip where fewer GPUs are present)
#   (b) all_reduce bus bandwidth 1 MiB - 1 GiB, flambeau's NCCL backend next to PyTorch's (bench/distributed.py)
#   (c) GPT-2 124M, B 8 x T 1024 per GPU, bf16 autocast, AdamW: DDP on 2 GPUs vs 1 GPU on the same global
#       batch (losses), vs 1 GPU on B 8 (scaling efficiency), next to PyTorch DDP (bench/distributed_train.py)
#   (d) FSDP2 (fully_shard) when flambeau has it; (e) a distributed checkpoint saved by 2 ranks and loaded by 1
#       when flambeau has flambeau.distributed.checkpoint; (f) 2-way tensor parallel (parallelize_module,
#       Megatron layout) vs 1 process on the same rows
#
#   bench/multi_gpu.sh [OUT_DIR]        env: DEVICE=cuda|cpu (cpu: the MPI engine and a small GPT, to check
#                                       this script's logic without GPUs), NPROC (2), TOTAL_S (seconds for the
#                                       whole run: parts c-e take what a-b leave, configurations past it are
#                                       skipped and say so), SELECT (pytest -k of part a), CKPT_DIR (part e)
# Logs and JSON lines go to OUT_DIR (default /tmp/multi_gpu); the exit status is 1 if any part failed.
set -u -o pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${1:-/tmp/multi_gpu}
DEVICE=${DEVICE:-cuda}
NPROC=${NPROC:-2}
TOTAL_S=${TOTAL_S:-3600}
CKPT_DIR=${CKPT_DIR:-/tmp/multi_gpu_dcp}     # part e's checkpoint (GBs for GPT-2: kept out of OUT_DIR)
mkdir -p "$OUT"
status=0
left() { echo $((TOTAL_S - SECONDS)); }

part() { echo; echo "=== ($1) $2  [$(date -u +%H:%M:%S)]"; }
has() { python3 -c "import importlib, sys; m = importlib.import_module('$1'); sys.exit(0 if hasattr(m, '$2') else 1)" \
        2>/dev/null; }

if [ "$DEVICE" = cuda ]; then
    SELECT=${SELECT:-nccl}; SIZE=(); MODES=eager,compiled; BW_ARGS=()
else
    SELECT=${SELECT:-world2 or gloo}; SIZE=(--small --steps 3 --warmup 1); MODES=eager; BW_ARGS=(--sizes 1M,16M --min-time 0.2)
fi

part a "collectives at world size $NPROC vs references"
python3 -m pytest -q -p no:cacheprovider tests/test_distributed_collectives.py tests/test_distributed_functional.py \
    tests/test_distributed_nccl.py -k "$SELECT" 2>&1 | tee "$OUT/a_collectives.log" | tail -15 || status=1

part b "all_reduce bus bandwidth, flambeau vs PyTorch"
python3 bench/distributed.py --device "$DEVICE" --nproc "$NPROC" "${BW_ARGS[@]}" 2>&1 | tee "$OUT/b_bandwidth.jsonl" \
    || status=1

part c "GPT-2 DDP on $NPROC vs 1, flambeau vs PyTorch"
python3 bench/distributed_train.py --device "$DEVICE" --nproc "$NPROC" --budget-s "$(left)" --modes "$MODES" \
    "${SIZE[@]}" 2>&1 | tee "$OUT/c_ddp.jsonl" || status=1
grep -q '"error"' "$OUT/c_ddp.jsonl" && echo "(c) some configurations failed or were skipped (see error fields)"

part d "FSDP2"
if has flambeau.distributed.fsdp fully_shard; then
    python3 bench/distributed_train.py --device "$DEVICE" --nproc "$NPROC" --parallel fsdp2 --modes eager \
        --budget-s "$(left)" "${SIZE[@]}" 2>&1 | tee "$OUT/d_fsdp2.jsonl" || status=1
else
    echo "(d) skipped: flambeau.distributed.fsdp.fully_shard does not exist on this checkout"
fi

part e "distributed checkpoint: saved by $NPROC ranks, loaded by 1"
if has flambeau.distributed.checkpoint save; then
    PARALLEL=ddp; has flambeau.distributed.fsdp fully_shard && PARALLEL=fsdp2
    python3 bench/distributed_train.py --device "$DEVICE" --nproc "$NPROC" --parallel $PARALLEL --checkpoint "$CKPT_DIR" \
        --systems flambeau --modes eager --budget-s "$(left)" "${SIZE[@]}" 2>&1 | tee "$OUT/e_dcp.jsonl" || status=1
else
    echo "(e) skipped: flambeau.distributed.checkpoint.save does not exist on this checkout"
fi

part f "GPT-2 ${NPROC}-way tensor parallel vs 1 process on the same rows, flambeau vs PyTorch"
python3 bench/distributed_train.py --device "$DEVICE" --nproc "$NPROC" --parallel tp --modes eager --configs ddp,single \
    --budget-s "$(left)" "${SIZE[@]}" 2>&1 | tee "$OUT/f_tp.jsonl" || status=1

echo; echo "=== done [$(date -u +%H:%M:%S)], status $status; logs in $OUT"
exit $status
