"""What each `bertforge` subcommand does: one `cmd_<name>(args, extra)` per subcommand, a thin layer over a
Python function of the package (imported when the command runs, so `bertforge --help` stays quick).

`pretrain`, `finetune` and `evaluate` build their settings from three sources, later ones winning: the run
file, the typed values of the flags (`cli.flags`), then the free-form `--section.key=value` overrides
(`cli.overrides`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertforge.cli.flags import FINETUNE_FLAGS, PRETRAIN_FLAGS, config_values
from bertforge.cli.overrides import evaluate_overrides, split_overrides
from bertforge.errors import ConfigError

if TYPE_CHECKING:
    from bertforge.training.finetune_config import FinetuneConfig
    from bertforge.training.pretraining import PretrainConfig


# --- vocab -----------------------------------------------------------------------------------------------

def cmd_vocab(args: argparse.Namespace, extra: list[str]) -> None:
    from bertforge.data.text_files import iter_lines, resolve_inputs
    from bertforge.tokenization import Tokenizer, TokenizerConfig
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
    from bertforge.data.preparation import prepare_corpus
    from bertforge.data.preparation_parts import Part, merge_parts
    from bertforge.data.pretraining import jieba_segmenter
    from bertforge.tokenization.tokenizer import Tokenizer

    if args.merge is not None:
        print(merge_parts(args.merge).summary())
        return
    missing = [flag for flag, value in (("--corpus", args.corpus), ("--tokenizer", args.tokenizer),
                                        ("--out", args.out)) if value is None]
    if missing:
        raise ConfigError(f"prepare needs {', '.join(missing)} (or --merge OUT to merge finished parts)")
    part = Part.parse(args.part) if args.part is not None else Part.from_env()
    sizes = {} if args.shard_size is None else {"shard_size": args.shard_size}
    tokenizer = Tokenizer.from_pretrained(args.tokenizer)
    report = prepare_corpus(
        args.corpus, tokenizer, args.out, max_seq_length=args.max_seq_length, short_seq_prob=args.short_seq_prob,
        dupe_factor=args.dupe_factor, seed=args.seed, workers=args.workers,
        heldout_fraction=args.heldout_fraction, heldout_documents=args.heldout_documents,
        resume=not args.no_resume, format=args.format,
        segmenter=jieba_segmenter() if args.segmenter == "jieba" else None, part=part, contiguous=args.contiguous,
        **sizes)
    # The data directory carries its vocabulary, so `pretrain --data DIR` needs nothing else.
    tokenizer.save_pretrained(args.out)
    print(report.summary())


# --- pretrain --------------------------------------------------------------------------------------------

def name_flags(message: str, values: dict[str, Any], command: str, common: dict[str, str]) -> str:
    """`message` with each setting a flag gave named by its flag as well, as the user typed it
    ("--epochs (finetune.training.epochs)=-1.0 is invalid ...")."""
    def dotted(tree: dict[str, Any], prefix: str = "") -> list[str]:
        keys = []
        for name, value in tree.items():
            keys += dotted(value, f"{prefix}{name}.") if isinstance(value, dict) else [prefix + name]
        return keys

    for key in dotted(values):
        flag = common.get(key) or "--" + key.rsplit(".", 1)[-1].replace("_", "-")
        pattern = rf"(?<![\w.-])((?:{command}\.)?{re.escape(key)})="
        message = re.sub(pattern, lambda match, flag=flag: f"{flag} ({match.group(1)})=", message)
    return message


def pretrain_config(args: argparse.Namespace, extra: list[str]) -> PretrainConfig:
    """The `PretrainConfig` the command line describes: run file, then flags, then overrides."""
    from bertforge.configuration import load_config
    from bertforge.training.pretraining import PretrainConfig

    values = config_values(args)
    cpu_minutes = getattr(args, "budget_cpu_minutes", None)
    if cpu_minutes is not None:
        training = values.setdefault("training", {})
        if "minutes" in training or training.get("budget_clock", "cpu") != "cpu":
            raise ConfigError("--budget-cpu-minutes X stands for --minutes X --budget-clock cpu: give either, "
                              "not both")
        training.update(minutes=cpu_minutes, budget_clock="cpu")
    try:
        return load_config(PretrainConfig, args.run_file, split_overrides(extra), values=values)
    except ConfigError as error:
        raise ConfigError(name_flags(str(error), values, "pretrain", PRETRAIN_FLAGS)) from None


def cmd_pretrain(args: argparse.Namespace, extra: list[str]) -> None:
    from bertforge.training.pretraining import run_pretraining

    print(run_pretraining(pretrain_config(args, extra)).summary())


# --- finetune / evaluate -------------------------------------------------------------------------------

def finetune_config(args: argparse.Namespace, extra: list[str]) -> FinetuneConfig:
    """The `FinetuneConfig` the command line describes: run file, then flags, then overrides."""
    from bertforge.training.finetune_config import load_finetune_config

    values = config_values(args)
    try:
        return load_finetune_config(args.run_file, split_overrides(extra), values=values)
    except ConfigError as error:
        raise ConfigError(name_flags(str(error), values, "finetune", FINETUNE_FLAGS)) from None


def cmd_finetune(args: argparse.Namespace, extra: list[str]) -> None:
    from bertforge.training.finetune import run_finetuning

    result = run_finetuning(finetune_config(args, extra))
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
    from pathlib import Path

    from bertforge.evaluation.saved_model import evaluate

    if Path(args.data).is_dir():  # a BEIR retrieval set (`bertforge retrieval-set`): retrieval figures
        from bertforge.cli.retrieval_commands import evaluate_retrieval_folder

        evaluate_retrieval_folder(args, extra)
        return
    result = evaluate(args.model, args.data, out_dir=args.out, labelled=not args.unlabelled,
                      batch_size=args.batch_size, device=args.device, precision=args.precision,
                      engine=args.engine, threads=args.threads, overrides=evaluate_overrides(args, extra) or None,
                      against=args.against, resamples=args.resamples, limit=args.limit)
    against = result.details.get("against")
    for name, value in result.metrics.items():
        line = f"{name}: {value:.4f}" if isinstance(value, float) else f"{name}: {value}"
        if against and name in against["changes"]:
            change = against["changes"][name]
            low, high = change["interval_95"]
            line += (f"  ({against['precision']}: {against['metrics'][name]:.4f}; change {change['point']:+.4f}, "
                     f"95% interval [{low:+.4f}, {high:+.4f}])")
        print(line)
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
    from bertforge.data.files import not_utf8, open_text
    from bertforge.errors import DataError
    from bertforge.inference.pipelines import load_pipeline
    from bertforge.inference.predict_lines import predict_stream
    from bertforge.processes import Ranks
    from bertforge.storage import open_atomic

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
    if source is not sys.stdin and args.output != "-":
        source.close()
        predict_file(args, options)
        return
    if Ranks.from_env().world_size > 1:
        raise ConfigError("under torchrun, predict reads --input FILE and writes --output FILE (not - for "
                          "standard input or output): the processes split the file and merge their results")
    try:
        pipeline = load_pipeline(args.model, args.task, device=args.device, precision=args.precision,
                                 engine=args.engine, threads=args.threads, batch_size=args.batch_size,
                                 max_length=args.max_length, doc_stride=args.doc_stride)
        # A file is written whole or not at all (a failure on any line leaves no partial file behind).
        with contextlib.nullcontext(sys.stdout) if args.output == "-" else open_atomic(args.output) as sink:
            try:
                count = predict_stream(pipeline, source, sink, **options,
                                       source="<stdin>" if args.input == "-" else args.input)
            except UnicodeDecodeError as error:
                if source is sys.stdin:
                    raise DataError(f"standard input is not UTF-8 text ({error.reason})", "<stdin>") from None
                raise not_utf8(args.input, error) from None
    finally:
        if source is not sys.stdin:
            source.close()
    print(f"{count} predictions written", file=sys.stderr)


def predict_file(args: argparse.Namespace, options: dict[str, Any]) -> None:
    """File to file: split among torchrun processes, resumable, the output written whole at the end."""
    from bertforge.inference.predict_corpus import predict_corpus
    from bertforge.processes import Ranks

    if args.chunk_lines is not None:
        options = {**options, "chunk_lines": args.chunk_lines}
    count = predict_corpus(args.model, args.task, args.input, args.output, device=args.device,
                           precision=args.precision, engine=args.engine, threads=args.threads,
                           batch_size=args.batch_size, max_length=args.max_length, doc_stride=args.doc_stride,
                           **options)
    if Ranks.from_env().rank == 0:
        print(f"{count} predictions written", file=sys.stderr)


def cmd_serve(args: argparse.Namespace, extra: list[str]) -> None:
    try:
        from bertforge.serving.app import serve
        from bertforge.serving.model_service import parse_model_option
        from bertforge.serving.search_routes import parse_index_option
    except ImportError as exc:
        raise ConfigError(f"serving needs the [serve] extra ({exc}); pip install 'bertforge[serve]'") from None
    # Settings left unset keep ServerSettings' defaults (the one place they are written down).
    limits = {name: getattr(args, name) for name in ("max_batch_tokens", "max_request_tokens", "request_timeout_s",
                                                     "drain_timeout_s", "max_body_bytes", "refusal_cooldown_s",
                                                     "max_items", "body_timeout_s", "max_incomplete_bodies", "max_answer_bytes",
                                                     "max_sparse_terms")
              if getattr(args, name) is not None}
    from bertforge.serving.guards import split_keys

    # Keys from the environment too, so they need not appear in the process list (`ps`) or shell history.
    limits["api_keys"] = split_keys([*args.api_key, os.environ.get("BERTFORGE_API_KEYS", "")])
    limits["allowed_hosts"] = tuple(args.allowed_host)
    limits["cors_origins"] = tuple(args.cors_origin)
    if args.auto_truncate is not None:
        limits["auto_truncate"] = args.auto_truncate
    named = [parse_model_option(value) for value in args.model]
    models = dict(named)
    if len(models) < len(named):
        twice = sorted({name for name, _ in named if [n for n, _ in named].count(name) > 1})
        raise ConfigError(f"--model: the name(s) {twice} are given twice; name each model once (NAME=DIR)")
    indexes: dict[str, list[str]] = {}
    for name, folders in map(parse_index_option, args.index):  # the same name twice: a hybrid pair
        indexes.setdefault(name, []).extend(folders)
    # One plain `--model DIR` stays a directory (served under its folder's name).
    plain = len(args.model) == 1 and named[0][1] == args.model[0]
    labels = {}
    for value in args.rerank_label:
        name, sep, label = value.rpartition("=")
        if not sep and len(models) > 1:
            raise ConfigError(f"--rerank-label {value}: several models are served ({list(models)}); name the one "
                              f"to rerank with: --rerank-label NAME={value}")
        labels[name or next(iter(models))] = label
    if labels:
        limits["rerank_labels"] = labels
    serve(args.model[0] if plain else models, indexes=indexes, host=args.host, port=args.port, device=args.device,
          precision=args.precision, engine=args.engine, threads=args.threads,
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
        from bertforge.engine.onnx_export import export_onnx
        from bertforge.engine.onnx_graph import export_optimized
    except ImportError as exc:
        raise ConfigError(f"export needs the [export] extra ({exc}); pip install 'bertforge[export]'") from None
    out = args.out or str(Path(args.model) / "model.onnx")
    if args.optimize or args.quantize:
        print(export_optimized(args.model, out, quantize=args.quantize).summary())
        return
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
             seed=args.seed, arch=args.arch)


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
