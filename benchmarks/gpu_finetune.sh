#!/usr/bin/env bash
# Fine-tuning on the GPU, bertforge and transformers side by side on full training sets (one H200):
# all-MiniLM-L6-v2 (carried as bf16 in gpu_carry/ft/minilm, restored to fp32 here), SST-2 (1 epoch),
# STS-B (3 epochs) and CoNLL-2003 (1 epoch), fp32, batch 32, lr 5e-5, seed 42, full dev sets.
# Usage (repo root, data under gpu_carry/ft/data): OUT=dir bash benchmarks/gpu_finetune.sh
set -uo pipefail
OUT=${OUT:-runs/gpu_finetune}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
python - <<'PY'
import shutil
import torch
from safetensors.torch import load_file, save_file
shutil.copytree("gpu_carry/ft/minilm", "/tmp/minilm32", dirs_exist_ok=True)
tensors = load_file("gpu_carry/ft/minilm/model.safetensors")
save_file({k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}, "/tmp/minilm32/model.safetensors")
print("torch", torch.__version__, torch.cuda.get_device_name(0))
PY
run() {  # task epochs limit_seconds
  timeout "$3" python benchmarks/finetune_vs_reference.py --task "$1" --epochs "$2" --train-limit 1000000 \
    --device cuda --model /tmp/minilm32 --data-root gpu_carry/ft/data --json "$OUT/$1.json" 2>&1 \
    | grep -vE "Warning|warn" | tail -8 | tee "$OUT/$1.log"
}
run sst2 1 75
run stsb 3 40
[ "${WITH_CONLL:-0}" = 1 ] && run conll2003 1 55
