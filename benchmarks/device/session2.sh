#!/bin/bash
# The second device session's checks (one GPU, 16 CPU cores), from the repository root:
#   OUT=/some/folder bash benchmarks/device/session2.sh
# The registered Triton RoPE op and FlexAttention on the GPU, every causal scheme's model on the GPU
# (train step, KV cache, compile), RoPE's GPU time from CUDA graphs; in the background on 13 of the
# CPU cores, the parity task with five seeds (per-question records, paired tests).
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
: "${OUT:?set OUT to a folder for the results}"
log() { echo "== $(date +%T) $*"; }

log environment
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"

log "parity, five seeds, on 13 CPU cores (background)"
(timeout 330 python3 -m posenc extrapolate --task parity --schemes nope,rope,alibi,t5,cope --seeds 0,1,2,3,4 \
    --workers 13 --threads 1 --no-progress --out /tmp/parity5 >/tmp/parity5.log 2>&1
 echo "exit $?" >>/tmp/parity5.log; cp /tmp/parity5/results.json "$OUT/parity5.json") &
PARITY=$!

log "Triton RoPE op: tests on CUDA"
timeout 45 python3 -m pytest tests/test_kernels_rope_triton.py -q -x -p no:cacheprovider 2>&1 | tail -6

log "Triton RoPE op: the check script"
timeout 95 python3 benchmarks/device/rope_triton_check.py --out "$OUT/rope_triton.json" 2>&1 | tail -60

log "FlexAttention: the check script"
timeout 95 python3 benchmarks/device/flex_check.py --out "$OUT/flex.json" 2>&1 | tail -45

log "every causal scheme in the model on the GPU: train step, KV cache, compile"
timeout 60 python3 benchmarks/device/model_gpu.py --schemes sinusoidal,rope,alibi,t5,kerple_log,fire,cope,transformer_xl,nope_temperature --out "$OUT/model_gpu.json" 2>&1 | grep -v Warning

log "RoPE paths on the GPU, CUDA-graph times"
timeout 45 python3 benchmarks/device/rope_gpu.py --out "$OUT/rope_gpu.json" 2>&1 | grep -v "^ *checks"

log "waiting for parity"
wait $PARITY
tail -n 25 /tmp/parity5.log
tar czf "$OUT/parity5_cells.tgz" -C /tmp parity5.log parity5/cells 2>/dev/null
log done
