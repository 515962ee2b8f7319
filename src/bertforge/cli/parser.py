"""The `bertforge` argument parser: one `add_<name>` function per subcommand, which declares its flags and
the `cmd_<name>` function (`cli.commands`) that runs it.

`pretrain` and `finetune` have a flag for every field of their run config (`cli.flags`): the common ones
first, under the short names of `PRETRAIN_FLAGS` / `FINETUNE_FLAGS`, then the rest by table, each named
after its field. Their help text, type and default are the field's own.
"""

from __future__ import annotations

import argparse

from bertforge.cli import (
    commands,
    corpus_commands,
    index_commands,
    map_commands,
    mining_commands,
    retrieval_commands,
)
from bertforge.cli.flags import (
    FINETUNE_FLAGS,
    PRETRAIN_FLAGS,
    ConfigFlag,
    add_config_flags,
    add_engine_flags,
    add_field_flag,
    field_of,
    read_bool,
)

# One precision rule for every command (`runtime.choose_precision`); training flags say it in their field help.
AUTO_RULE = "auto = bf16 on a CUDA GPU with bf16 support, else fp32"

# `bertforge evaluate`'s column flags: the saved task's reader settings they replace (`reader.<name>`).
EVALUATE_READER_FLAGS = {"text_a_column": "--text-a", "text_b_column": "--text-b", "label_column": "--label",
                         "id_column": "--id-column"}


class Parser(argparse.ArgumentParser):
    """argparse's parser, with a mistake said in one line (argparse prints the whole usage block first, which
    for `finetune` is 40 lines above the one that matters); `--help` still shows everything."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="bertforge", description="BERT end to end: vocab, prepare, pretrain, "
                                     "finetune, evaluate, predict, serve.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (add_vocab, add_prepare, add_pretrain, add_finetune, add_evaluate, add_glue, add_predict, add_serve,
                add_attention, add_plot, add_convert, add_export, add_demo, add_info):
        add(sub)
    corpus_commands.add_parsers(sub)
    index_commands.add_parsers(sub)
    retrieval_commands.add_parsers(sub)
    mining_commands.add_parsers(sub)
    map_commands.add_parsers(sub)
    return parser


def precision_choices() -> tuple[str, ...]:
    """The precisions of the inference commands (evaluate, predict, serve, embed, search)."""
    from bertforge.runtime import PRECISIONS

    return PRECISIONS


def training_precision_choices() -> tuple[str, ...]:
    """The precisions a command that trains takes: not the quantized ones (int8 is for inference)."""
    from bertforge.runtime import TRAINING_PRECISIONS

    return TRAINING_PRECISIONS


def add_vocab(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("vocab", help="learn a WordPiece vocabulary from a corpus")
    p.add_argument("--corpus", nargs="+", required=True, help="files, folders or glob patterns of UTF-8 text")
    p.add_argument("--vocab-size", type=int, required=True)
    p.add_argument("--out", required=True, help="directory for vocab.txt + tokenizer_config.json")
    p.add_argument("--cased", action="store_true", help="keep case and accents (default: lower-case)")
    p.add_argument("--lang", choices=["en", "zh"], default="en")
    p.add_argument("--min-frequency", type=int, default=2)
    p.add_argument("--unused", type=int, default=0, help="number of [unusedN] slots to reserve")
    p.add_argument("--heldout-fraction", type=float, default=0.01, help="lines held out for the [UNK] report")
    p.set_defaults(func=commands.cmd_vocab)


def add_prepare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prepare", help="turn a corpus into pretraining instance shards",
                       description="Turn a corpus into pretraining shards. Split across processes or machines "
                       "with --part i/n (or under torchrun), the parts write the shards one process writes; the "
                       "last part to finish writes index.json, or `bertforge prepare --merge OUT` does.")
    p.add_argument("--corpus", nargs="+", help="files, folders or glob patterns of UTF-8 text (required unless "
                   "--merge)")
    p.add_argument("--tokenizer", help="directory with vocab.txt (e.g. from `bertforge vocab`; required unless "
                   "--merge)")
    p.add_argument("--out", help="the data directory (required unless --merge)")
    p.add_argument("--part", help="prepare only part i of n (i counts from 0, e.g. 0/4 ... 3/4), one per process "
                   "or machine, all writing into the same --out (default under torchrun: RANK/WORLD_SIZE)")
    p.add_argument("--merge", metavar="OUT", help="only merge the finished parts' indexes in OUT into its "
                   "index.json (names the parts still missing)")
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--short-seq-prob", type=float, default=0.1)
    p.add_argument("--dupe-factor", type=int, default=1)
    p.add_argument("--contiguous", action="store_true", help="for masked LM alone (pretrain --objective mlm, "
                   "--arch modernbert): rows of consecutive text filled to --max-seq-length across sentences and "
                   "documents (a [SEP] between documents), as RoBERTa and ModernBERT train, instead of Google's "
                   "sentence pairs with next-sentence labels")
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--shard-size", type=int, default=None, help="characters of input text per shard (default "
                   "4000000, about 1M English tokens); more shards than parts keeps the parts busy")
    p.add_argument("--heldout-fraction", type=float, default=0.0)
    p.add_argument("--heldout-documents", type=int, default=None)
    p.add_argument("--format", choices=["auto", "sentences", "text", "documents"], default="auto")
    p.add_argument("--segmenter", choices=["none", "jieba"], default="none",
                   help="word segmenter for Chinese whole-word masking")
    p.add_argument("--no-resume", action="store_true", help="rewrite shards even if complete")
    p.set_defaults(func=commands.cmd_prepare)


def add_pretrain(sub: argparse._SubParsersAction) -> None:
    from bertforge.training.pretraining import PretrainConfig

    p = sub.add_parser("pretrain", help="pretrain with masked LM + next-sentence prediction (or MLM only: "
                                        "--objective mlm; a ModernBERT: --arch modernbert)")
    p.add_argument("run_file", nargs="?", help="optional TOML run file")
    add_config_flags(p, PretrainConfig, PRETRAIN_FLAGS)
    p.add_argument("--budget-cpu-minutes", type=float, metavar="X", help="a budget of X minutes of this process's "
                   "CPU time, all threads (--minutes X --budget-clock cpu): runs on a busy shared machine get the "
                   "same computation as on an idle one")
    p.set_defaults(func=commands.cmd_pretrain)


def add_finetune(sub: argparse._SubParsersAction) -> None:
    from bertforge.training.finetune_config import FinetuneConfig

    p = sub.add_parser("finetune", help="fine-tune on a named task or your own files, evaluating every epoch")
    p.add_argument("run_file", nargs="?", help="optional TOML run file")
    add_config_flags(p, FinetuneConfig, FINETUNE_FLAGS)
    p.add_argument("--no-dev", action=ConfigFlag, key="data.dev", nargs=0, const="",
                   help="train without evaluation (no dev set): best/ is then the final model")
    p.set_defaults(func=commands.cmd_finetune)


def add_evaluate(sub: argparse._SubParsersAction) -> None:
    from bertforge.evaluation.intervals import RESAMPLES
    from bertforge.families.task import ReaderSettings

    p = sub.add_parser("evaluate", help="score a fine-tuned model on a file; writes predictions and metrics",
                       epilog="Any other part of the saved task description: --reader.KEY=value, --inputs.KEY=value "
                       "or --options.KEY=value (e.g. --reader.header=false, --inputs.doc_stride=64).")
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True, help="the file to score; or a BEIR retrieval-set folder (corpus.jsonl, "
                   "queries.jsonl, qrels/test.tsv, e.g. from `bertforge retrieval-set`): retrieval figures of an "
                   "embedding model (ColBERT by exact MaxSim over the corpus, a SPLADE model by sparse dot product, "
                   "any other by cosine)")
    p.add_argument("--out")
    p.add_argument("--unlabelled", action="store_true", help="the file has no labels: predictions only")
    p.add_argument("--limit", type=int, help="score only the first N examples of the file (default: all)")
    for name, flag in EVALUATE_READER_FLAGS.items():
        own = "--" + name.replace("_", "-")
        note = "" if name == "id_column" else " (default: as fine-tuned)"
        add_field_flag(p, [flag] if own == flag else [flag, own], field_of(ReaderSettings, name, f"reader.{name}"),
                       note)
    p.add_argument("--batch-size", type=int, default=64)
    add_engine_flags(p)
    p.add_argument("--against", choices=precision_choices(),
                   help="also score at this precision and print each metric's change (--precision's score minus "
                        "this one's) with a 95%% paired-bootstrap interval (e.g. --precision int8 --against fp32: "
                        "what int8 costs on this file)")
    p.add_argument("--resamples", type=int, default=RESAMPLES,
                   help=f"bootstrap resamples for --against (default {RESAMPLES})")
    p.set_defaults(func=commands.cmd_evaluate)


def add_glue(sub: argparse._SubParsersAction) -> None:
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
    p.add_argument("--precision", choices=training_precision_choices(), help=f"default auto ({AUTO_RULE})")
    p.add_argument("--on-invalid", choices=["error", "skip"], help="malformed rows (default: error; QQP skip)")
    p.add_argument("--eval-batch-size", type=int)
    p.set_defaults(func=commands.cmd_glue)


def add_predict(sub: argparse._SubParsersAction) -> None:
    from bertforge.families import registry  # the pipeline routes are the registry's

    p = sub.add_parser("predict", help="run a pipeline over text or JSONL lines; writes JSONL")
    p.add_argument("--model", required=True)
    p.add_argument("--task", required=True, choices=list(registry.TASKS))
    p.add_argument("--input", default="-", help="file of lines (default: stdin)")
    p.add_argument("--output", default="-", help="JSONL output (default: stdout)")
    add_engine_flags(p)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--top-k", type=int)
    p.add_argument("--pooling", help="embed: cls, mean, max, mean_sqrt_len, weightedmean, lasttoken, or several joined by +"
                   " (default: the model directory's sentence-transformers pooling, else mean)")
    p.add_argument("--max-length", type=int, help="tokens per window (default: as the model was fine-tuned)")
    p.add_argument("--doc-stride", type=int, help="step between window starts of long inputs (default: as fine-tuned)")
    p.add_argument("--chunk-lines", type=int,
                   help="file to file: input lines per chunk, the unit torchrun processes share and a rerun "
                   "resumes (default 10000); chunks wait in OUTPUT.parts/ until the output is written whole")
    p.set_defaults(func=commands.cmd_predict)


def add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="HTTP server with micro-batching (needs the [serve] extra)")
    p.add_argument("--model", required=True, action="append", metavar="[NAME=]DIR",
                   help="a model directory to serve, optionally named (repeat to serve several: "
                        "--model embedder=DIR --model reranker=DIR); a plain DIR is named after its folder")
    p.add_argument("--index", action="append", default=[], metavar="NAME=DIR[,DIR...]",
                   help="a vector folder of `bertforge embed` to search at POST /search, named (repeat for several; "
                        "two or three folders of different kinds (dense, sparse, multi-vector) and the same input, "
                        "DENSE,SPARSE,MULTI_VECTOR or the same NAME repeated: hybrid, fused by reciprocal rank fusion; "
                        "rerank=MULTI_VECTOR among them: its MaxSim reranks their hits; or a Qdrant collection "
                        "`bertforge export-index` wrote: NAME=qdrant://HOST:PORT/COLLECTION or "
                        "NAME=qdrant+path:DIR?collection=C); the model that made it is served too (the manifest, or "
                        "the collection, names it)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--rerank-label", action="append", default=[], metavar="[NAME=]LABEL",
                   help="serve a two-label pair classifier (finetune --format pair) as a reranker too: relevance "
                        "= the probability of LABEL (a label name or index); NAME= picks the model when several "
                        "are served (repeat for several)")
    add_engine_flags(p)
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--max-wait-ms", type=float, default=5.0)
    p.add_argument("--max-queue", "--max-concurrent-requests", type=int, default=256, dest="max_queue",
                   help="requests accepted and not answered yet (waiting or in progress); one more gets 429 with "
                        "Retry-After, the only refusal that depends on the load (as text-embeddings-inference's "
                        "--max-concurrent-requests; default 256)")
    p.add_argument("--max-batch-tokens", type=int,
                   help="tokens (window lengths) in one model call; larger requests are split (default 4096)")
    p.add_argument("--max-request-tokens", type=int,
                   help="tokens of windows one request may make; more is refused with 413 (default 524288)")
    p.add_argument("--request-timeout-s", type=float,
                   help="a request not answered by then gets 503 and its remaining work is dropped (default 0: no "
                        "deadline; an accepted request is answered, and a client that gives up and closes its "
                        "connection drops its remaining work)")
    p.add_argument("--drain-timeout-s", type=float,
                   help="on SIGTERM, how long requests in progress may take to finish (default 30)")
    p.add_argument("--max-client-batch-size", type=int, dest="max_items",
                   help="inputs in one request (as text-embeddings-inference names it); more are refused "
                        "(default 2048, as OpenAI's embeddings API); each request is run in model calls of at most "
                        "--max-batch-tokens tokens")
    p.add_argument("--auto-truncate", type=read_bool, nargs="?", const=True, metavar="true|false",
                   help="an input longer than the model's window is cut to it on every embedding route (/v1/embeddings, "
                        "/embed, /embed_sparse, /embed_all, /similarity, rerank, /predict, /v1/embed), the count said "
                        "in the answer (X-Truncated-Inputs, usage.truncated_inputs); false refuses it naming the "
                        "limit. A TEI request's own truncate decides for it (default true, as TEI's --auto-truncate)")
    p.add_argument("--max-body-bytes", type=int, help="request body limit; larger gets 413 (default 8 MiB)")
    p.add_argument("--max-answer-bytes", type=int,
                   help="the most bytes one answer may take (vectors, token vectors, sparse vectors, attention "
                        "maps), counted before any model call at the most each number takes; larger gets 413 "
                        "(default 64 MiB)")
    p.add_argument("--max-sparse-terms", type=int,
                   help="terms a sparse (SPLADE) vector keeps at most, its largest weights (default 256; 0: all, "
                        "under --max-answer-bytes)")
    p.add_argument("--body-timeout-s", type=float,
                   help="a request body must arrive whole within this time of its headers, else 408 (default 30)")
    p.add_argument("--max-incomplete-bodies", type=int,
                   help="requests whose bodies are still arriving at once; more get 503 at once, before a byte "
                        "of theirs is read (default 128)")
    p.add_argument("--refusal-cooldown-s", type=float,
                   help="after a 413 to a body of 256 KiB or more, large bodies from that address get 429 for "
                        "this long, unread (default 1; 0: never)")
    p.add_argument("--api-key", action="append", default=[], metavar="KEY[,KEY...]",
                   help="require 'Authorization: Bearer KEY' (repeat or comma-separate for several keys; also "
                        "read from the environment variable BERTFORGE_API_KEYS); /health and /ready stay open")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="answer only requests whose Host header is NAME (repeat; default on loopback: "
                        "127.0.0.1, localhost, ::1; '*' allows any)")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="let browser pages from ORIGIN (e.g. https://app.example.com) call the server; "
                        "CORS is off without it")
    p.add_argument("--no-batching", action="store_true")
    p.set_defaults(func=commands.cmd_serve)


def add_attention(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("attention", help="attention maps of a text: PNG grid + interactive HTML")
    p.add_argument("--model", required=True)
    p.add_argument("text")
    p.add_argument("--layer", type=int)
    p.add_argument("--head", type=int)
    p.add_argument("--out", default="attention")
    p.set_defaults(func=commands.cmd_attention)


def add_plot(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="loss and accuracy curves of a training run (metrics.jsonl)")
    p.add_argument("run_dir")
    p.add_argument("--out")
    p.set_defaults(func=commands.cmd_plot)


def add_convert(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("convert", help="a Google TF or Hugging Face BERT checkpoint -> our model directory")
    p.add_argument("source", help="Google release or run_pretraining.py output directory, or a Hugging Face one")
    p.add_argument("--out", required=True, help="the model directory to write")
    p.add_argument("--step", type=int, help="run_pretraining.py step (default: the one its `checkpoint` file names)")
    p.add_argument("--casing", choices=["lower", "cased"],
                   help="override the tokenizer's casing (default: Google's rule on the directory name)")
    p.add_argument("--tokenizer", help="take vocab.txt from this directory (a run_pretraining.py output has none)")
    p.set_defaults(func=commands.cmd_convert)


def add_export(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="export to ONNX and check it against PyTorch")
    p.add_argument("--model", required=True)
    p.add_argument("--format", choices=["onnx"], default="onnx")
    p.add_argument("--out")
    p.add_argument("--optimize", action="store_true",
                   help="also write ONNX Runtime's fused graph (Attention, EmbedLayerNormalization, ...) beside --out "
                        "and its parity report")
    p.add_argument("--quantize", choices=["int8"],
                   help="also write the optimized graph quantized to int8 (implies --optimize)")
    p.set_defaults(func=commands.cmd_export)


def add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="vocab -> shards -> pretrain -> fill-mask -> fine-tune, on the bundled books")
    p.add_argument("--lang", choices=["en", "zh"], default="en")
    p.add_argument("--out", default="runs/demo")
    p.add_argument("--corpus", help="folder of books (default: data/demo/<lang>)")
    p.add_argument("--minutes", type=float, help="the whole demo's time budget (default 9): a warm-up times a "
                   "step on this machine, the demo announces its time and pretrains for what the budget leaves "
                   "(fewer steps on a slow or busy machine, never a longer run)")
    p.add_argument("--model", default="tiny", help="preset to pretrain (default tiny: the most steps per minute)")
    p.add_argument("--arch", choices=["bert", "modernbert"], default="bert",
                   help="the encoder to pretrain (default bert; modernbert: 3 layers of the tiny width, 30%% "
                   "masking, the same time and checks)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=commands.cmd_demo)


def add_info(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="print a model's config and parameter count")
    p.add_argument("model", help="preset name or model directory")
    p.set_defaults(func=commands.cmd_info)
