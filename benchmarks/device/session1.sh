#!/bin/bash
# One device session's checks on a CUDA machine (one GPU, 16 CPU cores), from the repository root:
#   OUT=/some/folder bash benchmarks/device/session1.sh
# The lab's CPU cells run on the machine's cores in the background while the GPU checks run.
# Each step has its own timeout; a failure is logged and the next step runs.
# .device/rope-seed0.safetensors is a saved posenc model (any RoPE TransformerLM), made beforehand:
#   python -c "from posenc.lab.checkpoint import load_trained_model; from posenc.model import save_model;
#              save_model(load_trained_model('runs/new-schemes/checkpoints/rope-seed0.safetensors'),
#                         '.device/rope-seed0.safetensors')"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=posenc
: "${OUT:?set OUT to a folder for the results}"
log() { echo "== $(date +%T) $*"; }

log environment
nvidia-smi -L; nproc; gcc --version | head -1
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name())"
python3 -c "import tqdm, safetensors, numpy, scipy, matplotlib, tokenizers; print('posenc deps ok')"

log "the lab's task cells on the CPU cores (background): copy (new schemes) and parity"
study() {  # name, then the extrapolate flags
    local name=$1; shift
    timeout 420 python3 -m posenc extrapolate "$@" --threads 1 --no-progress --out "/tmp/$name" >"/tmp/$name.log" 2>&1
    echo "exit $?" >>"/tmp/$name.log"; cp "/tmp/$name/results.json" "$OUT/$name.json"
}
study copy_new --task copy --schemes fire,kerple_log,kerple_power,cope --seeds 0,1,2 --workers 6 &
COPY=$!
study parity --task parity --schemes nope,rope,alibi,t5,cope --seeds 0,1,2 --workers 8 &
PARITY=$!

log "Triton RoPE tests on CUDA"
timeout 90 python3 -m pytest tests/test_kernels_rope_triton.py tests/test_readme.py -q -x -p no:cacheprovider 2>&1 | tail -15

log "RoPE on the GPU: posenc, reference, compile, HF, copy"
timeout 80 python3 benchmarks/device/rope_gpu.py --out "$OUT/rope_gpu.json"

log "--model on CUDA (bf16 autocast), the CPU numbers of the same file are computed off the device"
timeout 40 python3 -m posenc extrapolate --model .device/rope-seed0.safetensors --quick --device cuda --no-progress --out /tmp/m_cuda
cp /tmp/m_cuda/results.json "$OUT/model_cuda.json"
timeout 45 python3 -m posenc extrapolate --model .device/rope-seed0.safetensors --quick --device cuda \
    --finetune-len 128 --finetune-steps 50 --no-progress --out /tmp/m_ft | tail -25

log "every causal scheme in the model on the GPU: train step, KV cache, compile"
timeout 90 python3 benchmarks/device/model_gpu.py --out "$OUT/model_gpu.json"

log "what --model costs for a 110M Llama on the GPU"
timeout 70 python3 benchmarks/device/pretrained_cost.py --folder /tmp/llama -- --device cuda --eval-windows 64 --out /tmp/llama_out | tail -20

log "waiting for the CPU studies"
wait $COPY $PARITY
tail -n 4 /tmp/copy_new.log /tmp/parity.log
tar czf "$OUT/cells.tgz" -C /tmp copy_new.log parity.log copy_new/cells parity/cells 2>/dev/null
log done
