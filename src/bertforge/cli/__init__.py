"""The `bertforge` command line: one subcommand per workflow, each a thin layer over a Python function.

Every subcommand prints a user mistake (`BertforgeError`) as one line and exits with status 2; a traceback
means a bug in bertforge. Commands that train take an optional TOML run file, flags made from their config's
fields (typed values: `cli.flags`), and `--section.key=value` overrides for anything else (`cli.overrides`;
unknown keys are rejected with the list of valid ones). The parser is `cli.parser`, what each subcommand
does is `cli.commands`; this module runs them. A command that runs a model for inference (`INFERENCE_COMMANDS`)
first makes OpenMP's idle threads sleep rather than spin (`engine.threads.quiet_waiting`), before anything
imports torch (building the parser does).
"""

from __future__ import annotations

import logging
import shlex
import sys

from bertforge.cli.commands import finetune_config, pretrain_config
from bertforge.cli.overrides import (
    OVERRIDE_COMMANDS,
    evaluate_overrides,
    join_unknown_values,
    split_overrides,
)
from bertforge.cli.parser import FINETUNE_FLAGS, PRETRAIN_FLAGS, build_parser
from bertforge.engine.threads import quiet_waiting
from bertforge.errors import BertforgeError

# The subcommands that run a model for inference: those with --engine (tests/unit/test_engine_threads.py checks)
# and search, which embeds its queries.
INFERENCE_COMMANDS = ("evaluate", "predict", "serve", "embed", "add", "search", "mine-negatives", "score-margins",
                      "evaluate-embeddings")

__all__ = ["FINETUNE_FLAGS", "INFERENCE_COMMANDS", "PRETRAIN_FLAGS", "build_parser", "entry", "evaluate_overrides", "finetune_config",
           "join_unknown_values", "main", "pretrain_config", "split_overrides"]


def main(argv: list[str] | None = None) -> int:
    """Run one `bertforge` command line; returns the exit status (2: a user mistake, reported in one line)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if next((word for word in argv if not word.startswith("-")), None) in INFERENCE_COMMANDS:
        quiet_waiting()
    parser = build_parser()
    args, extra = parser.parse_known_args(join_unknown_values(parser, argv))
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(message)s")
    try:
        if extra and args.command not in OVERRIDE_COMMANDS:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.func(args, extra)
        leave_process_group()
    except BertforgeError as exc:
        print(f"bertforge {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print(interrupted_message(exc, args, argv), file=sys.stderr)
        return 130
    return 0


def interrupted_message(exc: KeyboardInterrupt, args, argv: list[str]) -> str:
    """What Ctrl-C prints: for a training command, the checkpoint to resume from and the command that does."""
    out_dir = getattr(exc, "out_dir", None)
    if out_dir is None and args.command in ("pretrain", "finetune") and hasattr(args, "config_values"):
        out_dir = (args.config_values.get("training") or {}).get("out_dir")
    if out_dir is None or "torch" not in sys.modules:
        return "interrupted"
    from bertforge.training.checkpoint import find_latest

    latest = find_latest(out_dir)
    step = getattr(exc, "step", None)
    head = "interrupted" if step is None else f"interrupted after step {step} (its checkpoint is saved)"
    if latest is None:
        return f"{head}; no checkpoint in {out_dir} yet: a new run starts from the beginning"
    kept = [a for i, a in enumerate(argv) if not (a in ("--resume", "--training.resume") or a.startswith(
        ("--resume=", "--training.resume=")) or (i and argv[i - 1] in ("--resume", "--training.resume")))]
    command = shlex.join(["bertforge", *kept, "--resume", "auto"])
    return f"{head}; the latest checkpoint is {latest}; resume with:\n  {command}"


def leave_process_group() -> None:
    """Leave the torch.distributed process group a command joined (training under torchrun), before the
    interpreter exits: a gloo group left to the exit sequence aborted its process now and then ("terminate
    called without an active exception", SIGABRT after a finished run), and torchrun then failed the run."""
    if "torch.distributed" in sys.modules:  # a command that never loaded torch joined nothing
        from bertforge.training.distributed import teardown

        teardown()


def entry() -> None:
    """The `bertforge` console script (pyproject.toml) and `python -m bertforge`."""
    sys.exit(main())
