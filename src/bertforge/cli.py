"""The `bertforge` command line: one subcommand per workflow, each a thin layer over a Python function.

Every subcommand prints a user mistake (`BertforgeError`) as one line and exits with status 2; a traceback
means a bug in bertforge. Commands that train take an optional TOML run file plus `--section.key=value`
overrides (unknown keys are rejected with the list of valid ones).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import logging
import re
import sys
import typing
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError, ConfigError

OVERRIDE = re.compile(r"^--([A-Za-z_][\w]*(\.[A-Za-z_]\w*)*)=(.*)$", re.S)


def split_overrides(extra: list[str]) -> list[str]:
    """Arguments argparse did not know, as `key=value` overrides of the run's config.

    Accepted spellings: `--section.key=value`, `--key=value`, `--some-key value` and a bare `--some-flag`
    (true); hyphens in names become underscores. The config rejects keys it does not have.
    """
    overrides = []
    items = list(extra)
    while items:
        arg = items.pop(0)
        key, sep, value = arg.partition("=")
        match = OVERRIDE.match("--" + key[2:].replace("-", "_") + sep + value) if key.startswith("--") else None
        if match and sep:
            overrides.append(f"{match.group(1)}={match.group(3)}")
            continue
        name = arg[2:].replace("-", "_") if arg.startswith("--") else ""
        if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", name):
            raise ConfigError(f"unrecognised argument {arg!r}; any setting of a run file can be given as "
                              "--key value, --key=value or --section.key=value (e.g. --training.lr=5e-5)")
        if items and not items[0].startswith("--"):
            overrides.append(f"{name}={items.pop(0)}")
        else:
            overrides.append(f"{name}=true")
    return overrides


# --- vocab -----------------------------------------------------------------------------------------------

def cmd_vocab(args: argparse.Namespace, extra: list[str]) -> None:
    from bertforge.data.corpus import iter_lines, resolve_inputs
    from bertforge.tokenization.tokenizer import Tokenizer, TokenizerConfig
    from bertforge.tokenization.vocab_builder import build_vocab, unk_rate

    files = resolve_inputs(args.corpus)
    heldout: list[str] = []
    every = max(1, round(1 / args.heldout_fraction)) if args.heldout_fraction > 0 else 0

    def training_lines():
        # Every k-th non-empty line is held out (bounded) to report the [UNK] rate on unseen text.
        count = 0
        for path in files:
            for line in iter_lines(path):
                if not line.strip():
                    continue
                count += 1
                if every and count % every == 0:
                    if len(heldout) < 50_000:
                        heldout.append(line)
                    continue
                yield line

    lower = not args.cased
    vocab = build_vocab(training_lines(), args.vocab_size, do_lower_case=lower, lang=args.lang,
                        min_frequency=args.min_frequency, num_unused=args.unused)
    tokenizer = Tokenizer(vocab, TokenizerConfig(do_lower_case=lower))
    tokenizer.save_pretrained(args.out)
    rate = unk_rate(tokenizer, heldout)
    print(f"vocabulary of {len(vocab)} tokens written to {args.out} (do_lower_case={lower})")
    print(f"[UNK] rate on {len(heldout)} held-out lines: {100 * rate:.3f}%")


# --- prepare ---------------------------------------------------------------------------------------------

def cmd_prepare(args: argparse.Namespace, extra: list[str]) -> None:
    from bertforge.data.pretraining import jieba_segmenter
    from bertforge.data.shards import prepare_corpus
    from bertforge.tokenization.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_pretrained(args.tokenizer)
    report = prepare_corpus(
        args.corpus, tokenizer, args.out, max_seq_length=args.max_seq_length, short_seq_prob=args.short_seq_prob,
        dupe_factor=args.dupe_factor, seed=args.seed, workers=args.workers,
        heldout_fraction=args.heldout_fraction, heldout_documents=args.heldout_documents,
        resume=not args.no_resume, format=args.format,
        segmenter=jieba_segmenter() if args.segmenter == "jieba" else None)
    # The data directory carries its vocabulary, so `pretrain --data DIR` needs nothing else.
    tokenizer.save_pretrained(args.out)
    print(report.summary())


# --- pretrain --------------------------------------------------------------------------------------------

PRETRAIN_FLAGS = {
    "data": "data_dir", "tokenizer": "tokenizer", "model": "model", "out": "training.out_dir",
    "steps": "training.steps", "batch_size": "training.batch_size", "lr": "training.lr",
    "precision": "training.precision", "resume": "training.resume", "seed": "training.seed",
    "device": "training.device", "optimizer": "training.optimizer",
    "whole_word_masking": "masking.whole_word_masking", "grad_accumulation": "training.grad_accumulation",
    "pack_sequences": "pack_sequences",
}


def flag_overrides(args: argparse.Namespace, table: dict[str, str]) -> list[str]:
    """Turn the convenience flags that were given into `dotted.key=value` overrides (TOML literals)."""
    overrides = []
    for flag, key in table.items():
        value = getattr(args, flag, None)
        if value is None or value is False or value == []:
            continue
        literal = json.dumps(value) if isinstance(value, (str, bool)) else repr(value)
        overrides.append(f"{key}={literal.lower() if isinstance(value, bool) else literal}")
    return overrides + list(getattr(args, "config_overrides", None) or [])


TRUE_WORDS, FALSE_WORDS = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


class ConfigFlag(argparse.Action):
    """A flag generated from a config field (`add_config_flags`): appends `key=<TOML literal>` to
    `args.config_overrides`, which `flag_overrides` hands on with the other overrides.

    A bool field takes an optional value (`--progress`, `--progress false`, `--progress=true`); a list takes
    one argument, comma-separated (`--labels neg,pos`) or a TOML list (`--labels '["neg", "pos"]'`).
    `literal` makes a flag without a value that always sets that literal (`--no-dev` -> data.dev = "").
    """

    def __init__(self, option_strings, dest, key: str = "", kind: Any = str, literal: str | None = None,
                 **kwargs):
        if literal is not None:
            kwargs["nargs"] = 0
        elif kind is bool:
            kwargs.setdefault("nargs", "?")
            kwargs.setdefault("metavar", "BOOL")
        super().__init__(option_strings, "config_overrides", **kwargs)
        self.key, self.kind, self.literal = key, kind, literal

    def __call__(self, parser, namespace, values, option_string=None):
        text = self.literal if self.literal is not None else self.toml(values)
        namespace.config_overrides = [*(getattr(namespace, "config_overrides", None) or []), f"{self.key}={text}"]

    def toml(self, value: str | None) -> str:
        kind, origin = self.kind, typing.get_origin(self.kind)
        if kind is bool:
            word = "true" if value is None else value.strip().lower()
            if word not in TRUE_WORDS + FALSE_WORDS:
                raise argparse.ArgumentError(self, f"expected true or false, got {value!r}")
            return "true" if word in TRUE_WORDS else "false"
        if origin is list:
            if value.lstrip().startswith("["):
                return value
            (item,) = typing.get_args(kind) or (str,)
            try:
                items = [item(part.strip()) if item in (int, float) else part.strip()
                         for part in value.split(",") if part.strip()]
            except ValueError:
                raise argparse.ArgumentError(self, f"expected comma-separated {item.__name__}s, got {value!r}") \
                    from None
            return json.dumps(items, ensure_ascii=False)
        if kind is str:
            return json.dumps(value, ensure_ascii=False)
        return value  # numbers: the config checks the value and names the key


def field_helps(cls: type) -> dict[str, str]:
    """Each attribute's first sentence in the `Attributes:` docstring section of a config dataclass (or of the
    class it extends, e.g. FinetuneTrainingConfig's TrainingConfig)."""
    helps: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            helps.update(attribute_helps(inspect.getdoc(klass) or ""))
    return helps


def attribute_helps(doc: str) -> dict[str, str]:
    section = doc.partition("Attributes:\n")[2]
    entries: list[str] = []
    for line in section.splitlines():
        if line.startswith("    ") and not line.startswith("     ") and entries is not None:
            entries.append(line.strip())
        elif line.startswith("        ") and entries:
            entries[-1] += " " + line.strip()
        elif line.strip():
            break
    helps: dict[str, str] = {}
    for entry in entries:
        # Several attributes may share a line: "max_query_length: QA question tokens. max_answer_length: ..."
        for piece in re.split(r"(?<=[.)])\s+(?=[a-z_0-9]+(?:(?:, | / )[a-z_0-9]+)*: )", entry):
            names, sep, text = piece.partition(": ")
            if not sep:
                continue
            first = re.split(r"(?<=[a-z)])\. (?=[A-Z(`])", text)[0].rstrip(".")
            for name in re.split(r", | / ", names):
                helps[name.strip()] = first
    return helps


def add_config_flags(parser: argparse.ArgumentParser, tables: dict[str, type], prefix: str = "") -> None:
    """One flag per field of each config class in `tables` ({title: class}), grouped by table, for the
    fields no flag of `parser` covers yet: `--eval-every N` sets `training.eval_every`. Dataclass and dict
    fields (tables, model_overrides) are left to `--section.key=value`."""
    for title, cls in tables.items():
        group = parser.add_argument_group(f"[{title}] settings" if title else "run settings")
        hints, helps = typing.get_type_hints(cls), field_helps(cls)
        for item in dataclasses.fields(cls):
            flag = "--" + item.name.replace("_", "-")
            if flag in parser._option_string_actions:
                continue
            kind = hints[item.name]
            args = [a for a in typing.get_args(kind) if a is not type(None)]
            if args and typing.get_origin(kind) is not list and len(args) == 1:
                kind = args[0]  # X | None -> X
            if dataclasses.is_dataclass(kind) or kind is dict or typing.get_origin(kind) is dict or kind is Any:
                continue
            default = item.default if item.default is not dataclasses.MISSING else None
            shown = "" if default is None else f" (default {json.dumps(default, ensure_ascii=False)})"
            metavar = {int: "N", float: "X", str: "TEXT"}.get(kind, "A,B" if typing.get_origin(kind) is list else None)
            dotted = f"{prefix}{title}.{item.name}" if title else f"{prefix}{item.name}"
            group.add_argument(flag, action=ConfigFlag, key=dotted, kind=kind,
                               help=(helps.get(item.name, f"{dotted}") + shown).replace("%", "%%"),
                               **({"metavar": metavar} if metavar else {}))


def cmd_pretrain(args: argparse.Namespace, extra: list[str]) -> None:
    from bertforge.configuration import load_config
    from bertforge.training.pretraining import PretrainConfig, run_pretraining

    overrides = flag_overrides(args, PRETRAIN_FLAGS) + split_overrides(extra)
    config = load_config(PretrainConfig, args.run_file, overrides)
    print(run_pretraining(config).summary())


# --- finetune / evaluate -------------------------------------------------------------------------------

# Each convenience flag of `bertforge finetune` and the FinetuneConfig key it sets (see its tables).
FINETUNE_FLAGS = {
    "task": "data.task", "format": "data.format", "train": "data.train", "dev": "data.dev", "model": "model",
    "out": "training.out_dir", "text_a": "data.text_a_column", "text_b": "data.text_b_column",
    "label": "data.label_column", "epochs": "training.epochs", "batch_size": "training.batch_size",
    "lr": "training.lr", "max_seq_length": "features.max_seq_length", "seed": "training.seed",
    "device": "training.device", "precision": "training.precision", "train_limit": "data.train_limit",
    "dev_limit": "data.dev_limit", "data_root": "data.data_root", "freeze_encoder": "head.freeze_encoder",
    "fresh_head": "head.fresh_head", "warmup_ratio": "training.warmup_ratio", "resume": "training.resume",
    "feature_layers": "head.feature_layers", "classifier_hidden": "head.classifier_hidden_sizes",
}


def int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def cmd_finetune(args: argparse.Namespace, extra: list[str]) -> None:
    from bertforge.training.finetuning import load_finetune_config, run_finetuning

    # Flags first, then --key=value overrides, flat (--lr=2e-5) or dotted (--training.lr=2e-5); the run
    # file may use either spelling too (load_finetune_config places flat keys with finetune_key).
    for name in ("feature_layers", "classifier_hidden"):  # `-1 -2` and `-1,-2` both give one flat list
        if getattr(args, name):
            setattr(args, name, [value for group in getattr(args, name) for value in group])
    overrides = flag_overrides(args, FINETUNE_FLAGS) + split_overrides(extra)
    if args.seeds:
        overrides.append(f"seeds={[seed for group in args.seeds for seed in group]}")
    config = load_finetune_config(args.run_file, overrides)
    result = run_finetuning(config)
    if hasattr(result, "line"):
        print(result.line())
    else:
        print(finetune_summary(result))
        for warning in result.warnings:
            print(f"warning: {warning}")


def finetune_summary(result) -> str:
    """What a fine-tuning run did, for the console: how it resumed, the best dev metrics, where the model is."""
    lines = [result.resumed] if result.resumed else []
    if result.best_metrics:
        metrics = ", ".join(f"{k}={v:.4f}" for k, v in result.best_metrics.items())
        lines.append(f"{result.task}: best dev {metrics} (step {result.best_step}); model saved to "
                     f"{result.model_dir}")
    else:
        lines.append(f"{result.task}: trained {result.total_steps or result.best_step} steps without evaluation "
                     f"(no dev set); final model saved to {result.model_dir}")
    if result.test_metrics:
        lines.append(f"{result.task}: test " + ", ".join(f"{k}={v:.4f}" for k, v in result.test_metrics.items()))
    return "\n".join(lines)


def cmd_evaluate(args: argparse.Namespace, extra: list[str]) -> None:
    from bertforge.configuration import parse_override
    from bertforge.training.finetuning import evaluate

    overrides = dict(parse_override(item) for item in split_overrides(extra))
    for flag, key in (("text_a", "text_a_column"), ("text_b", "text_b_column"), ("label", "label_column"),
                      ("id_column", "id_column")):
        if getattr(args, flag) is not None:
            overrides[key] = getattr(args, flag)
    result = evaluate(args.model, args.data, out_dir=args.out, labelled=not args.unlabelled,
                      batch_size=args.batch_size, device=args.device, precision=args.precision,
                      overrides=overrides or None)
    for name, value in result.metrics.items():
        print(f"{name}: {value:.4f}" if isinstance(value, float) else f"{name}: {value}")
    for warning in result.warnings:
        print(f"warning: {warning}")


def cmd_glue(args: argparse.Namespace, extra: list[str]) -> None:
    from bertforge.training.glue import TRAINING_KEYS, run_glue

    settings = {key: getattr(args, key, None) for key in TRAINING_KEYS}
    tasks = [name for name in (args.tasks or "").split(",") if name.strip()]
    result = run_glue(args.model, data_root=args.data_root, out_dir=args.out, tasks=tasks, settings=settings)
    print(result.table())
    for row in result.rows:
        for note in row.notes:
            print(f"note: {row.row.name}: {note}")


# --- inference -------------------------------------------------------------------------------------------

def cmd_predict(args: argparse.Namespace, extra: list[str]) -> None:
    from bertforge.data.classification import not_utf8, open_text
    from bertforge.errors import DataError
    from bertforge.inference.pipelines import load_pipeline, predict_stream

    options = {}
    if args.top_k is not None:
        options["top_k"] = args.top_k
    if args.pooling is not None:
        options["pooling"] = args.pooling
    # The files first: a wrong path should not wait for (or hide behind) loading the model.
    source = sys.stdin if args.input == "-" else open_text(args.input)
    if args.output != "-" and not Path(args.output).resolve().parent.is_dir():
        raise DataError(f"the folder {Path(args.output).resolve().parent} does not exist; create it or choose "
                        "another --output", args.output)
    try:
        pipeline = load_pipeline(args.model, args.task, device=args.device, precision=args.precision,
                                 batch_size=args.batch_size, max_length=args.max_length, doc_stride=args.doc_stride)
        sink = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8")  # noqa: SIM115
        try:
            count = predict_stream(pipeline, source, sink, source="<stdin>" if args.input == "-" else args.input,
                                   **options)
        except UnicodeDecodeError as error:
            if source is sys.stdin:
                raise DataError(f"standard input is not UTF-8 text ({error.reason})", "<stdin>") from None
            raise not_utf8(args.input, error) from None
        finally:
            if sink is not sys.stdout:
                sink.close()
    finally:
        if source is not sys.stdin:
            source.close()
    print(f"{count} predictions written", file=sys.stderr)


def cmd_serve(args: argparse.Namespace, extra: list[str]) -> None:
    try:
        from bertforge.inference.server import serve
    except ImportError as exc:
        raise ConfigError(f"serving needs the [serve] extra ({exc}); pip install 'bertforge[serve]'") from None
    # Settings left unset keep ServerSettings' defaults (the one place they are written down).
    limits = {name: getattr(args, name) for name in ("max_batch_tokens", "max_request_tokens", "request_timeout_s")
              if getattr(args, name) is not None}
    serve(args.model, host=args.host, port=args.port, device=args.device, precision=args.precision,
          max_batch_size=args.max_batch_size, max_wait_ms=args.max_wait_ms, max_queue=args.max_queue,
          micro_batching=not args.no_batching, **limits)


def cmd_attention(args: argparse.Namespace, extra: list[str]) -> None:
    from bertforge.inference.attention import render_attention

    written = render_attention(args.model, args.text, args.out, layer=args.layer, head=args.head)
    for kind, path in written.items():
        if path is not None:
            print(f"{kind}: {path}")


def cmd_plot(args: argparse.Namespace, extra: list[str]) -> None:
    from bertforge.inference.plots import plot_run

    print(plot_run(args.run_dir, args.out))


def cmd_convert(args: argparse.Namespace, extra: list[str]) -> None:
    from bertforge.conversion import convert

    casing = {None: None, "lower": True, "cased": False}[args.casing]
    print(convert(args.source, args.out, step=args.step, do_lower_case=casing, tokenizer=args.tokenizer).summary())


def cmd_export(args: argparse.Namespace, extra: list[str]) -> None:
    try:
        from bertforge.inference.export import export_onnx
    except ImportError as exc:
        raise ConfigError(f"export needs the [export] extra ({exc}); pip install 'bertforge[export]'") from None
    out = args.out or str(Path(args.model) / "model.onnx")
    report = export_onnx(args.model, out)
    print(f"wrote {report.path}")
    for name, diff in report.max_abs_diff.items():
        print(f"max |onnxruntime - torch| {name}: {diff:.2e}")
    if report.torch_ms is not None:
        print(f"batch {report.speed_shape}: torch {report.torch_ms:.1f} ms, onnxruntime {report.onnxruntime_ms:.1f} ms")


# --- demo ----------------------------------------------------------------------------------------------

def cmd_demo(args: argparse.Namespace, extra: list[str]) -> None:
    from bertforge.demo import run_demo

    run_demo(lang=args.lang, out=args.out, corpus=args.corpus, minutes=args.minutes, model=args.model,
             seed=args.seed)


# --- info ------------------------------------------------------------------------------------------------

def cmd_info(args: argparse.Namespace, extra: list[str]) -> None:
    import torch

    from bertforge.model.bert import BertModel
    from bertforge.model.config import PRESETS, BertConfig

    if args.model in PRESETS:
        config = BertConfig.preset(args.model)
        architecture = "BertModel"
    else:
        from bertforge.checkpoint_format import read_config

        config, architecture = read_config(args.model)
    with torch.device("meta"):
        params = sum(p.numel() for p in BertModel(config).parameters())
    print(config.to_json_string().rstrip())
    print(f"architecture: {architecture or 'BertModel'}; encoder parameters (with pooler): {params:,}")


# --- parser ----------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    from bertforge.families import registry  # the pipeline routes are the registry's
    from bertforge.runtime import PRECISIONS  # one precision rule for every command: runtime.choose_precision
    from bertforge.training.config import TrainingConfig  # the flags generated from the config fields
    from bertforge.training.finetuning import TABLES as FINETUNE_TABLES
    from bertforge.training.finetuning import FinetuneConfig

    auto_rule = "auto = bf16 on a CUDA GPU with bf16 support, else fp32"

    parser = argparse.ArgumentParser(prog="bertforge", description="BERT end to end: vocab, prepare, pretrain, "
                                     "finetune, evaluate, predict, serve.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("vocab", help="learn a WordPiece vocabulary from a corpus")
    p.add_argument("--corpus", nargs="+", required=True, help="files, folders or glob patterns of UTF-8 text")
    p.add_argument("--vocab-size", type=int, required=True)
    p.add_argument("--out", required=True, help="directory for vocab.txt + tokenizer_config.json")
    p.add_argument("--cased", action="store_true", help="keep case and accents (default: lower-case)")
    p.add_argument("--lang", choices=["en", "zh"], default="en")
    p.add_argument("--min-frequency", type=int, default=2)
    p.add_argument("--unused", type=int, default=0, help="number of [unusedN] slots to reserve")
    p.add_argument("--heldout-fraction", type=float, default=0.01, help="lines held out for the [UNK] report")
    p.set_defaults(func=cmd_vocab)

    p = sub.add_parser("prepare", help="turn a corpus into pretraining instance shards")
    p.add_argument("--corpus", nargs="+", required=True)
    p.add_argument("--tokenizer", required=True, help="directory with vocab.txt (e.g. from `bertforge vocab`)")
    p.add_argument("--out", required=True)
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--short-seq-prob", type=float, default=0.1)
    p.add_argument("--dupe-factor", type=int, default=1)
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--heldout-fraction", type=float, default=0.0)
    p.add_argument("--heldout-documents", type=int, default=None)
    p.add_argument("--format", choices=["auto", "sentences", "text", "documents"], default="auto")
    p.add_argument("--segmenter", choices=["none", "jieba"], default="none",
                   help="word segmenter for Chinese whole-word masking")
    p.add_argument("--no-resume", action="store_true", help="rewrite shards even if complete")
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("pretrain", help="pretrain with masked LM + next-sentence prediction")
    p.add_argument("run_file", nargs="?", help="optional TOML run file")
    p.add_argument("--data", help="directory from `bertforge prepare`")
    p.add_argument("--tokenizer", help="vocabulary directory (default: the one recorded with the data)")
    p.add_argument("--model", help="preset (tiny, mini, small, medium, base, large) or a checkpoint directory")
    p.add_argument("--out")
    p.add_argument("--steps", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--grad-accumulation", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--optimizer", choices=["adamw", "lamb"])
    p.add_argument("--precision", choices=PRECISIONS, help=f"default auto ({auto_rule})")
    p.add_argument("--device")
    p.add_argument("--seed", type=int)
    p.add_argument("--resume", help="auto, never, or a checkpoint directory")
    p.add_argument("--whole-word-masking", action="store_true")
    p.add_argument("--pack-sequences", action="store_true",
                   help="several short instances per row (block-diagonal attention): fewer rows, same losses")
    add_config_flags(p, {"training": TrainingConfig})
    p.set_defaults(func=cmd_pretrain)

    p = sub.add_parser("finetune", help="fine-tune on a named task or your own files, evaluating every epoch")
    p.add_argument("run_file", nargs="?", help="optional TOML run file")
    p.add_argument("--task", help="sst2, cola, stsb, rte, wnli, conll2003, squad, chnsenticorp, afqmc, lcqmc, "
                   "msra_ner, cmrc2018, drcd")
    p.add_argument("--format", help="classification, pair, regression, ner, qa or choice (with --train/--dev)")
    p.add_argument("--train", help="training file (with --task: replaces the named task's)")
    p.add_argument("--dev", help="dev file, evaluated every epoch to pick best/ (see --no-dev)")
    p.add_argument("--model", help="model directory to start from (ours or a Hugging Face BERT)")
    p.add_argument("--out", "--out-dir", dest="out", help="run directory (default runs/finetune)")
    p.add_argument("--text-a", "--text-a-column", dest="text_a",
                   help="column of the first text (header name or 0-based index)")
    p.add_argument("--text-b", "--text-b-column", dest="text_b", help="column of the second text")
    p.add_argument("--label", "--label-column", dest="label", help="column of the label")
    p.add_argument("--epochs", type=float, help="passes over the training data (default 3; see --steps)")
    p.add_argument("--batch-size", type=int, help="examples per micro-batch (default 32)")
    p.add_argument("--lr", type=float, help="peak learning rate (default 5e-5)")
    p.add_argument("--warmup-ratio", type=float, help="linear warmup, a fraction of the steps (default 0.1)")
    p.add_argument("--max-seq-length", type=int, help="tokens per window (default 128, QA 384)")
    p.add_argument("--seed", type=int, help="seed of the head, shuffling and dropout (default 42)")
    p.add_argument("--seeds", type=int_list, nargs="+",
                   help="e.g. 1,2,3 or 1 2 3: one run per seed, mean ± std reported")
    p.add_argument("--device", help="auto (cuda if available), cpu, cuda or cuda:N")
    p.add_argument("--precision", choices=PRECISIONS, help=f"default auto ({auto_rule})")
    p.add_argument("--train-limit", type=int, help="use only the first N training examples")
    p.add_argument("--dev-limit", type=int, help="use only the first N dev examples")
    p.add_argument("--data-root", help="folder holding the named tasks' data (default ../shared/data)")
    p.add_argument("--freeze-encoder", action="store_true", help="feature-based: train the head only")
    p.add_argument("--feature-layers", type=int_list, nargs="+",
                   help="e.g. -1 -2 -3 -4 (or --feature-layers=-1,-2,-3,-4): concatenate these layers")
    p.add_argument("--classifier-hidden", "--classifier-hidden-sizes", dest="classifier_hidden", type=int_list,
                   nargs="+", help="hidden widths of the head, e.g. 128 or 256 128")
    p.add_argument("--fresh-head", action="store_true", help="discard a stored head of another shape")
    p.add_argument("--resume", help="auto (continue from the newest checkpoint in --out, if any), never, or a "
                   "checkpoint directory")
    p.add_argument("--no-dev", action=ConfigFlag, key="data.dev", literal='""',
                   help="train without evaluation (no dev set): best/ is then the final model")
    add_config_flags(p, {"": FinetuneConfig, **FINETUNE_TABLES})
    p.set_defaults(func=cmd_finetune)

    p = sub.add_parser("evaluate", help="score a fine-tuned model on a file; writes predictions and metrics")
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out")
    p.add_argument("--unlabelled", action="store_true", help="the file has no labels: predictions only")
    p.add_argument("--text-a", "--text-a-column", dest="text_a",
                   help="column of the first text (header name or 0-based index; default: as fine-tuned)")
    p.add_argument("--text-b", "--text-b-column", dest="text_b", help="column of the second text")
    p.add_argument("--label", "--label-column", dest="label", help="column of the label")
    p.add_argument("--id-column", help="column whose value names each prediction (default: a column named "
                   "index, id, idx, qid or guid when the header has one, else the row's file:line)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS,
                   help=f"default fp32; {auto_rule}")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("glue", help="fine-tune and evaluate every GLUE task present; the paper's table and the "
                       "leaderboard's submission files")
    p.add_argument("--model", required=True, help="model directory every task starts from")
    p.add_argument("--data-root", help="folder holding glue/<TASK>/ (default ../shared/data)")
    p.add_argument("--out", "--out-dir", dest="out", default="runs/glue",
                   help="one run per task, submission/<TASK>.tsv, glue_table.txt, glue_results.json")
    p.add_argument("--tasks", help="comma-separated, e.g. cola,sst2,mnli,ax (default: all; absent ones skipped)")
    p.add_argument("--epochs", type=float)
    p.add_argument("--steps", type=int, help="optimizer steps per task instead of epochs")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--warmup-ratio", type=float)
    p.add_argument("--max-seq-length", type=int)
    p.add_argument("--train-limit", type=int, help="use only the first N training examples of each task")
    p.add_argument("--dev-limit", type=int, help="score only the first N dev examples (test files: all rows)")
    p.add_argument("--seed", type=int)
    p.add_argument("--device")
    p.add_argument("--precision", choices=PRECISIONS, help=f"default auto ({auto_rule})")
    p.add_argument("--on-invalid", choices=["error", "skip"], help="malformed rows (default: error; QQP skip)")
    p.add_argument("--eval-batch-size", type=int)
    p.set_defaults(func=cmd_glue)

    p = sub.add_parser("predict", help="run a pipeline over text or JSONL lines; writes JSONL")
    p.add_argument("--model", required=True)
    p.add_argument("--task", required=True, choices=list(registry.TASKS))
    p.add_argument("--input", default="-", help="file of lines (default: stdin)")
    p.add_argument("--output", default="-", help="JSONL output (default: stdout)")
    p.add_argument("--device", default="auto")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS,
                   help=f"default fp32, the precision evaluate scores at; {auto_rule}")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--top-k", type=int)
    p.add_argument("--pooling", choices=["cls", "mean", "max"])
    p.add_argument("--max-length", type=int, help="tokens per window (default: as the model was fine-tuned)")
    p.add_argument("--doc-stride", type=int, help="step between window starts of long inputs (default: as fine-tuned)")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("serve", help="HTTP server with micro-batching (needs the [serve] extra)")
    p.add_argument("--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", default="auto")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS,
                   help=f"default fp32, the precision evaluate scores at; {auto_rule}")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--max-wait-ms", type=float, default=5.0)
    p.add_argument("--max-queue", type=int, default=256)
    p.add_argument("--max-batch-tokens", type=int,
                   help="tokens (window lengths) in one model call; larger requests are split (default 4096)")
    p.add_argument("--max-request-tokens", type=int,
                   help="tokens of windows one request may make; more is refused with 413 (default 524288)")
    p.add_argument("--request-timeout-s", type=float,
                   help="a request not answered by then gets 503 (default 60; 0: no limit)")
    p.add_argument("--no-batching", action="store_true")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("attention", help="attention maps of a text: PNG grid + interactive HTML")
    p.add_argument("--model", required=True)
    p.add_argument("text")
    p.add_argument("--layer", type=int)
    p.add_argument("--head", type=int)
    p.add_argument("--out", default="attention")
    p.set_defaults(func=cmd_attention)

    p = sub.add_parser("plot", help="loss and accuracy curves of a training run (metrics.jsonl)")
    p.add_argument("run_dir")
    p.add_argument("--out")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("convert", help="a Google TF or Hugging Face BERT checkpoint -> our model directory")
    p.add_argument("source", help="Google release or run_pretraining.py output directory, or a Hugging Face one")
    p.add_argument("--out", required=True, help="the model directory to write")
    p.add_argument("--step", type=int, help="run_pretraining.py step (default: the one its `checkpoint` file names)")
    p.add_argument("--casing", choices=["lower", "cased"],
                   help="override the tokenizer's casing (default: Google's rule on the directory name)")
    p.add_argument("--tokenizer", help="take vocab.txt from this directory (a run_pretraining.py output has none)")
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser("export", help="export to ONNX and check it against PyTorch")
    p.add_argument("--model", required=True)
    p.add_argument("--format", choices=["onnx"], default="onnx")
    p.add_argument("--out")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("demo", help="vocab -> shards -> pretrain -> fill-mask -> fine-tune, on the bundled books")
    p.add_argument("--lang", choices=["en", "zh"], default="en")
    p.add_argument("--out", default="runs/demo")
    p.add_argument("--corpus", help="folder of books (default: data/demo/<lang>)")
    p.add_argument("--minutes", type=float, default=3.5, help="pretraining time budget")
    p.add_argument("--model", default="mini", help="preset to pretrain")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("info", help="print a model's config and parameter count")
    p.add_argument("model", help="preset name or model directory")
    p.set_defaults(func=cmd_info)
    return parser


def join_unknown_values(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """Rewrite `--unknown-key value` as `--unknown-key=value` for the subcommands that take config overrides.

    Otherwise argparse hands `value` to the optional positional run file (`--progress false` would look for a
    run file named "false").
    """
    if not argv or argv[0] not in ("pretrain", "finetune", "evaluate"):
        return argv
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    known = subparsers.choices[argv[0]]._option_string_actions
    out, items = [argv[0]], list(argv[1:])
    while items:
        item = items.pop(0)
        if (item.startswith("--") and "=" not in item and item not in known and items
                and not items[0].startswith("--")):
            item = f"{item}={items.pop(0)}"
        elif item in known and known[item].nargs != 0 and items and not items[0].startswith("--"):
            # a known option keeps its own value (an optional one, e.g. `--progress`, may have none)
            out.append(item)
            item = items.pop(0)
        out.append(item)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(join_unknown_values(parser, argv))
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(message)s")
    try:
        if extra and args.command not in ("pretrain", "finetune", "evaluate"):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.func(args, extra)
    except BertforgeError as exc:
        print(f"bertforge {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
