#!/usr/bin/env bash
# Fine-tuning on the GPU, bertforge and transformers side by side with the issue's recipe (one H200):
# all-MiniLM-L6-v2 (carried as bf16 in gpu_carry/ft/minilm, restored to fp32 here), batch 32, lr 5e-5,
# max length 128 (384 for SQuAD), bf16 autocast on both sides, seed 42, full training sets and dev sets.
# STS-B and CoNLL-2003 3 epochs, SQuAD v1.1 (36 articles -> the other 12) 2 epochs, SST-2 3 epochs last
# (the longest; a timeout there loses nothing else). Each task has its own time limit; about 9 minutes in all.
# Build the carry folder with benchmarks/make_gpu_carry.sh, then run with carry ["gpu_carry/ft"]:
#   OUT=dir bash benchmarks/gpu_finetune.sh
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
    --device cuda --precision bf16 --model /tmp/minilm32 --data-root gpu_carry/ft/data --json "$OUT/$1.json" 2>&1 \
    | grep -vE "Warning|warn" | tail -8 | tee "$OUT/$1.log"
}
run stsb 3 60
run conll2003 3 120
run squad 2 150
run sst2 3 240
