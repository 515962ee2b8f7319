"""The CPU threads of an inference process on a shared machine: the cores it may use (`cpu_quota`), its intra-op
and tokenizer threads within them (`plan_cpu_threads`), and waiting without spinning (`quiet_waiting`).

This module imports no torch: `quiet_waiting` must run before torch is first imported, since the OpenMP
runtime torch's CPU build links (GNU libgomp in the PyPI wheels) reads its wait policy once, when it loads.

The cores a process may use are the fewest of: the CPUs it may run on (`os.sched_getaffinity`), and its CPU
quota (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`, the smallest along its cgroup's
path), rounded down (a quota of 1.5 CPUs keeps one thread busy without being throttled every period; never
less than 1). A thread count in the environment (`THREAD_VARIABLES`, the first one set: what torch and the
BLAS libraries read) or `--threads` is a request, honoured as given.

The threads (`plan_cpu_threads`), on the CPU: the intra-op threads take every core the process may use (or
fewer where torch already runs fewer: its default is the physical cores, and a caller may have lowered it), and
the inputs are tokenized in the calling thread between model calls, so intra-op plus tokenizer threads never
outnumber the cores. A tokenizer thread streams beside the model only where a requested intra-op count
leaves it a core of its own. Why not one thread fewer for the model and one for the tokenizer: tokenizing
costs far less than the model (2,000 STS-B sentences: 0.02 s against 8 s of MiniLM), and a third busy
thread on two cores makes an OpenMP region wait for whichever thread the kernel set aside. On a GPU the
tokenizer thread streams beside the device as before. A server with several models has one model thread per
model, each with these intra-op threads: they take turns on the cores (`inference.lane`, one model's work at a
time), so the count stays every usable core, never a fraction per model.

Waiting (`quiet_waiting`): a thread that has finished its share of a parallel region spins before it sleeps
(libgomp: 300,000 spins by default; ONNX Runtime's pool spins too), burning a neighbour's CPU time, and ours
when the neighbour holds the core it waits for. `OMP_WAIT_POLICY=PASSIVE` (libgomp, and the MKL threading
layer it serves) and `KMP_BLOCKTIME=0` (Intel's OpenMP, where a build links it) make them sleep at once;
ONNX Runtime's sessions get `session.intra_op.allow_spinning = 0` (`engine.onnxruntime`). A value the user
set is kept.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bertforge.errors import ConfigError

# Read by torch (intra-op threads at start-up) and the BLAS/OpenMP libraries; the first one set is the request.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "BLIS_NUM_THREADS")
# What makes a waiting OpenMP thread sleep at once: libgomp's (and the standard's), Intel OpenMP's.
WAIT_VARIABLES = {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0"}
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


@dataclass(frozen=True)
class CpuQuota:
    """The cores this process may keep busy, why, and the thread count the environment asks for (if any)."""

    cores: int
    why: str
    requested: int | None = None
    variable: str | None = None


def cgroup_limit(root: Path | None = None, proc_cgroup: Path | None = None) -> tuple[float | None, str]:
    """(CPUs the cgroup quota allows, where it was read), the smallest along the process's cgroup path from
    its own cgroup up to the root; (None, why) without a quota. Defaults: `CGROUP_ROOT`, `PROC_CGROUP`."""
    root = CGROUP_ROOT if root is None else root
    proc_cgroup = PROC_CGROUP if proc_cgroup is None else proc_cgroup
    try:
        lines = proc_cgroup.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None, "no cgroup file"
    limits: list[tuple[float, str]] = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":  # v2: one hierarchy, cpu.max in each folder
            for folder in _folders(root, path):
                limits += _v2_limit(folder / "cpu.max")
        elif "cpu" in controllers.split(","):
            for base in (root / "cpu,cpuacct", root / "cpu", root / controllers):
                if base.is_dir():
                    for folder in _folders(base, path):
                        limits += _v1_limit(folder)
                    break
    if not limits:
        return None, "no cgroup CPU quota"
    return min(limits)


def _folders(base: Path, path: str) -> list[Path]:
    """`base/path` and its parents up to `base` (inside a container the path may not exist: `base` alone)."""
    parts = [part for part in path.strip().split("/") if part]
    return [base.joinpath(*parts[:end]) for end in range(len(parts), -1, -1) if base.joinpath(*parts[:end]).is_dir()]


def _v2_limit(path: Path) -> list[tuple[float, str]]:
    try:
        quota, period = (path.read_text(encoding="utf-8").split() + ["100000"])[:2]
    except OSError:
        return []
    if quota == "max":
        return []
    return [(int(quota) / int(period), f"cgroup {path} {quota}/{period}")]


def _v1_limit(folder: Path) -> list[tuple[float, str]]:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text(encoding="utf-8"))
        period = int((folder / "cpu.cfs_period_us").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if quota <= 0 or period <= 0:  # -1: no quota
        return []
    return [(quota / period, f"cgroup {folder / 'cpu.cfs_quota_us'} {quota}/{period}")]


def requested_threads(environ: Mapping[str, str] | None = None) -> tuple[int | None, str | None]:
    """(count, variable) of the first thread variable set in the environment; (None, None) if none is.

    Raises:
        ConfigError: a value that is not a positive integer (OpenMP's list form "4,2": its first number).
    """
    environ = os.environ if environ is None else environ
    for name in THREAD_VARIABLES:
        value = environ.get(name, "").strip()
        if not value:
            continue
        first = value.split(",")[0].strip()
        if not first.isdigit() or int(first) < 1:
            raise ConfigError(f"{name}={value!r} is not a positive thread count; set it to a number such as 2, "
                              "or unset it to use every core this process may use")
        return int(first), name
    return None, None


def cpu_quota(environ: Mapping[str, str] | None = None, affinity: set[int] | None = None,
              root: Path | None = None, proc_cgroup: Path | None = None) -> CpuQuota:
    """The cores this process may use (module docstring) and the thread count the environment asks for."""
    if affinity is None:
        affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    cores, why = max(1, len(affinity)), f"{len(affinity)} CPUs in the affinity mask"
    limit, where = cgroup_limit(root, proc_cgroup)
    if limit is not None:
        allowed = max(1, int(limit + 1e-9))
        why += f", quota {limit:g} CPUs ({where})"
        if allowed < cores:
            cores = allowed
    requested, variable = requested_threads(environ)
    return CpuQuota(cores, f"{cores} cores usable ({why})", requested, variable)


@dataclass(frozen=True)
class CpuThreads:
    """Intra-op threads, tokenizer threads beside them (0: tokenized in the calling thread), and why."""

    intra_op: int
    tokenizer: int
    why: str


def plan_cpu_threads(threads: int | None, current: int | None = None, quota: CpuQuota | None = None) -> CpuThreads:
    """The threads of a CPU inference run (module docstring): `threads` (`--threads`) or the environment's
    count when either is given, else the usable cores, or fewer where the process already runs fewer
    (`current`: torch's count, which is the physical cores by default and whatever a caller set); a tokenizer
    thread only beside a count that leaves it a core."""
    quota = cpu_quota() if quota is None else quota
    if threads is not None:
        intra, source = threads, "requested"
    elif quota.requested is not None:
        intra, source = quota.requested, f"{quota.variable}={quota.requested}"
    elif current is not None and current < quota.cores:
        intra, source = current, "PyTorch's count in this process"
    else:
        intra, source = quota.cores, "every usable core"
    tokenizer = 1 if intra < quota.cores else 0
    beyond = f", more than the {quota.cores} usable" if intra > quota.cores else ""
    where = "a tokenizer thread beside them" if tokenizer else "inputs tokenized between model calls"
    return CpuThreads(intra, tokenizer, f"threads: {intra} intra-op ({source}{beyond}), {where}; {quota.why}; "
                                        f"{waiting_state()}")


def quiet_waiting(environ: dict[str, str] | None = None, torch_loaded: bool | None = None) -> bool:
    """Make OpenMP threads sleep, not spin, once their work is done (`WAIT_VARIABLES`; values the user set are
    kept), where that can still take effect: before torch is first imported. Returns whether it was in time."""
    environ = os.environ if environ is None else environ
    if torch_loaded if torch_loaded is not None else "torch" in sys.modules:
        return False
    for name, value in WAIT_VARIABLES.items():
        environ.setdefault(name, value)
    return True


def waiting_state(environ: Mapping[str, str] | None = None) -> str:
    """How this process's OpenMP threads wait, for a plan's reason."""
    environ = os.environ if environ is None else environ
    policy = environ.get("OMP_WAIT_POLICY")
    if policy is None:
        return "waiting: OpenMP's default (spins before sleeping; set OMP_WAIT_POLICY=PASSIVE before torch loads)"
    return f"waiting: OMP_WAIT_POLICY={policy}"


__all__ = ["CpuQuota", "CpuThreads", "THREAD_VARIABLES", "WAIT_VARIABLES", "cgroup_limit", "cpu_quota",
           "plan_cpu_threads", "quiet_waiting", "requested_threads", "waiting_state"]
