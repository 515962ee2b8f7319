"""ONNX Runtime's dynamic int8 on a fine-tuned bertforge classifier: dev accuracy at ORT fp32 and ORT int8, the
comparison row of the int8 accuracy budget (docs/cpu_inference.md). The graph is our export run through ONNX
Runtime's BERT optimizer, then `onnxruntime.quantization.quantize_dynamic` (QInt8 weights, its defaults), as a
CPU user would do it. Inputs are built as `bertforge evaluate` builds them (the model's own tokenizer, the
fine-tuning record's max_seq_length).

    python -m benchmarks.ort_int8_accuracy --model runs/sst2/best --data ../shared/data/glue/SST-2/dev.tsv
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import torch

from benchmarks.cpu_precision import ort_runners
from bertforge.checkpoint_format import read_directory
from bertforge.inference.export import export_onnx


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True, help="a GLUE single-sentence TSV with header sentence<TAB>label")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    directory = read_directory(args.model)
    tokenizer = directory.require_tokenizer()
    record = json.loads((Path(args.model) / "finetuning.json").read_text())
    max_length = record.get("inputs", {}).get("max_seq_length", 128)
    rows = [line.split("\t") for line in Path(args.data).read_text().splitlines()[1:]]
    label_ids = {name: index for index, name in enumerate(directory.config.label_names)}
    gold = np.array([label_ids[label] for _, label in rows])
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = Path(tmp) / "model.onnx"
        export_onnx(args.model, onnx_path, check=False)
        runners, counts = ort_runners(onnx_path, directory.config, args.threads)
        for name, run in runners.items():
            predictions = []
            for start in range(0, len(rows), 32):
                encodings = tokenizer.encode_batch([text for text, _ in rows[start:start + 32]], padding="longest",
                                                   truncation=True, max_length=max_length)
                ids = torch.tensor([e.ids for e in encodings])
                mask = torch.tensor([e.attention_mask for e in encodings])
                predictions.append(run(ids, mask).argmax(-1).numpy())
            results[f"ORT {name}"] = float((np.concatenate(predictions) == gold).mean())
    print(json.dumps({"model": args.model, "data": args.data, "examples": len(rows), "accuracy": results,
                      "fused_ops": counts}))


if __name__ == "__main__":
    main()
