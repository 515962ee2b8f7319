#!/usr/bin/env bash
# GPU check (one H200, <= ~8 minutes, nothing but the GPU image's torch + transformers + this tree):
#   1. correctness of the fast paths in bf16 against fp32,
#   2. the throughput table against transformers (pretraining step, inference fixed/variable length),
#   3. a short `base` pretraining run on real shards (gpu_carry/en_data, carried from `bertforge prepare`),
#   4. a kernel profile of one base pretraining step and of variable-length inference on each side.
# Usage (from the repo root): OUT=/some/dir bash benchmarks/gpu_check.sh
set -uo pipefail
OUT=${OUT:-runs/gpu_check}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
python - <<'PY' 2>&1 | tee "$OUT/env.txt"
import torch, transformers, platform
print("torch", torch.__version__, "transformers", transformers.__version__, "python", platform.python_version())
print("device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")
PY
date -u +"%Y-%m-%d %H:%M UTC" >> "$OUT/env.txt"
echo "== 1. fast paths vs plain fp32"
timeout 90 python -m benchmarks.fast_path_check --device cuda 2>&1 | tee "$OUT/fast_paths.md"
echo "== 2. throughput vs transformers"
timeout 240 python -m benchmarks.model_speed --device cuda --repeats 5 2>&1 | grep -v Warning | tee "$OUT/throughput.md"
if [ -d gpu_carry/en_data ]; then
  echo "== 3. base pretraining on pretrain_en shards"
  timeout 120 python -m bertforge pretrain --data gpu_carry/en_data --model base --out "$OUT/pretrain_base" \
    --steps 300 --batch-size 256 --lr 1e-4 --precision bf16 --training.warmup_steps=30 \
    --training.log_every=50 --training.eval_every=300 --training.fused_adamw=true --training.progress=false \
    --training.save_every=0 2>&1 | grep -v "^Warning" | tail -12 | tee "$OUT/pretrain_base.log"
  rm -rf "$OUT"/pretrain_base/checkpoint-*/model.safetensors "$OUT"/pretrain_base/checkpoint-*/training_state.pt
fi
echo "== 4. profile: base pretraining step and variable-length inference, both sides"
timeout 120 python -m benchmarks.gpu_profile --preset base --batch 256 --tokens 128 --inference 2>&1 | grep -v Warning \
  | tee "$OUT/profile_base.md"
