"""The thread policy of inference on a shared CPU (`engine.threads`) and the engine `--engine auto` picks
(`engine.build.choose_kind`): the quota read from cgroup files, affinity and the environment; intra-op plus
tokenizer threads within it; the plan's reason stating both; OpenMP told not to spin before torch loads."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bertforge.engine import threads as T
from bertforge.engine.build import ENGINE_VARIABLE, choose_kind, plan_engine
from bertforge.engine.engine import TorchEngine
from bertforge.engine.plan import EnginePlan
from bertforge.errors import ConfigError

SRC = Path(__file__).resolve().parents[2] / "src"


def fake_cgroup(tmp_path: Path, proc_line: str, files: dict[str, str]) -> tuple[Path, Path]:
    """(cgroup root, /proc/self/cgroup) holding `files` (paths relative to the root)."""
    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    root.mkdir(exist_ok=True)
    proc = tmp_path / "proc-cgroup"
    proc.write_text(proc_line + "\n", encoding="utf-8")
    return root, proc


def test_cpu_quota_reads_cgroup_v2_cpu_max_smallest_along_the_path(tmp_path):
    root, proc = fake_cgroup(tmp_path, "0::/user.slice/job", {
        "cpu.max": "max 100000\n", "user.slice/cpu.max": "300000 100000\n", "user.slice/job/cpu.max": "max 100000\n"})
    quota = T.cpu_quota({}, affinity=set(range(8)), root=root, proc_cgroup=proc)
    assert quota.cores == 3 and "quota 3 CPUs" in quota.why and "user.slice/cpu.max" in quota.why
    assert quota.requested is None


def test_cpu_quota_rounds_a_fractional_quota_down_never_below_one(tmp_path):
    root, proc = fake_cgroup(tmp_path, "0::/", {"cpu.max": "150000 100000\n"})
    assert T.cpu_quota({}, affinity={0, 1, 2, 3}, root=root, proc_cgroup=proc).cores == 1
    root, proc = fake_cgroup(tmp_path / "small", "0::/", {"cpu.max": "20000 100000\n"})
    assert T.cpu_quota({}, affinity={0, 1}, root=root, proc_cgroup=proc).cores == 1


def test_cpu_quota_reads_cgroup_v1_quota_and_period(tmp_path):
    root, proc = fake_cgroup(tmp_path, "4:cpu,cpuacct:/docker/abc", {
        "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "200000\n", "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n"})
    assert T.cpu_quota({}, affinity=set(range(16)), root=root, proc_cgroup=proc).cores == 2
    root, proc = fake_cgroup(tmp_path / "none", "4:cpu,cpuacct:/", {
        "cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"})
    assert T.cpu_quota({}, affinity=set(range(6)), root=root, proc_cgroup=proc).cores == 6  # -1: no quota


def test_cpu_quota_reads_the_root_when_a_container_hides_its_cgroup_path(tmp_path):
    root, proc = fake_cgroup(tmp_path, "0::/kubepods/pod1/ctr", {"cpu.max": "100000 100000\n"})
    assert T.cpu_quota({}, affinity={0, 1, 2, 3}, root=root, proc_cgroup=proc).cores == 1


def test_cpu_quota_takes_the_affinity_mask_when_it_is_smaller(tmp_path):
    root, proc = fake_cgroup(tmp_path, "0::/", {"cpu.max": "800000 100000\n"})
    quota = T.cpu_quota({}, affinity={3, 5}, root=root, proc_cgroup=proc)
    assert quota.cores == 2 and "2 CPUs in the affinity mask" in quota.why
    missing = T.cpu_quota({}, affinity={0, 1, 2}, root=tmp_path / "absent", proc_cgroup=tmp_path / "absent-file")
    assert missing.cores == 3


def test_requested_threads_honours_omp_and_mkl_variables_and_refuses_a_bad_value():
    assert T.requested_threads({"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "5"}) == (3, "OMP_NUM_THREADS")
    assert T.requested_threads({"MKL_NUM_THREADS": "5"}) == (5, "MKL_NUM_THREADS")
    assert T.requested_threads({"OMP_NUM_THREADS": "4,2"}) == (4, "OMP_NUM_THREADS")  # OpenMP's nested list
    assert T.requested_threads({"OMP_NUM_THREADS": " "}) == (None, None)
    with pytest.raises(ConfigError, match="OMP_NUM_THREADS='two' is not a positive thread count"):
        T.requested_threads({"OMP_NUM_THREADS": "two"})
    with pytest.raises(ConfigError, match="MKL_NUM_THREADS='0'"):
        T.requested_threads({"MKL_NUM_THREADS": "0"})


def quota_of(cores: int, requested: int | None = None) -> T.CpuQuota:
    return T.CpuQuota(cores, f"{cores} cores usable (test)", requested, "OMP_NUM_THREADS" if requested else None)


def test_intra_op_and_tokenizer_threads_never_outnumber_the_usable_cores():
    for cores in range(1, 9):
        for current in (None, *range(1, 17)):
            chosen = T.plan_cpu_threads(None, current, quota_of(cores))
            assert 1 <= chosen.intra_op <= cores and chosen.intra_op + chosen.tokenizer <= cores, (cores, current)
        for asked in range(1, cores + 1):
            chosen = T.plan_cpu_threads(asked, 16, quota_of(cores))
            assert chosen.intra_op == asked and chosen.intra_op + chosen.tokenizer <= cores
            assert chosen.tokenizer == (1 if asked < cores else 0)  # a tokenizer thread only on a spare core
    # torch's default on 16 CPUs of a 2-CPU quota would have been 16 busy threads
    assert T.plan_cpu_threads(None, 16, quota_of(2)).intra_op == 2
    # the environment's count is a request, honoured as given (and said to exceed the quota)
    chosen = T.plan_cpu_threads(None, 4, quota_of(2, requested=4))
    assert chosen.intra_op == 4 and chosen.tokenizer == 0 and "OMP_NUM_THREADS=4, more than the 2 usable" in chosen.why


def test_plan_reason_states_the_quota_and_the_thread_decision(tmp_path, monkeypatch):
    root, proc = fake_cgroup(tmp_path, "0::/", {"cpu.max": "100000 100000\n"})
    monkeypatch.setattr(T, "CGROUP_ROOT", root)
    monkeypatch.setattr(T, "PROC_CGROUP", proc)
    for name in T.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    plan = plan_engine("cpu", "fp32", "torch")
    assert (plan.threads, plan.tokenizer_threads) == (1, 0)
    assert "threads: 1 intra-op (every usable core), inputs tokenized between model calls" in plan.reason
    assert "1 cores usable" in plan.reason and f"{root / 'cpu.max'} 100000/100000" in plan.reason
    assert "waiting:" in plan.reason
    assert plan.describe()["tokenizer_threads"] == 0
    monkeypatch.setenv("OMP_NUM_THREADS", "two")
    with pytest.raises(ConfigError, match="OMP_NUM_THREADS"):
        plan_engine("cpu", "fp32", "torch")


def test_plan_on_a_gpu_has_no_cpu_threads_and_streams_the_tokenizer():
    from bertforge.engine.plan import plan_threads

    assert plan_threads(None, torch.device("meta"))[:2] == (None, 1)


def test_streamed_tokenizer_thread_starts_only_where_the_plan_has_one(monkeypatch):
    from bertforge.data.finetuning import Feature
    from bertforge.evaluation import streaming
    from bertforge.model.bert import BertModel
    from conftest import make_tiny_config

    started = []
    real_start = streaming._Producer.start
    monkeypatch.setattr(streaming._Producer, "start", lambda self: started.append(self) or real_start(self))
    model = BertModel(make_tiny_config()).eval()

    def features(items):
        return [Feature(example_index=i, input_ids=[2, 5 + i, 3], token_type_ids=[0, 0, 0]) for i in range(len(items))]

    def forward(engine, batch):
        return list(engine(batch.input_ids).last_hidden_state[:, 0].sum(-1).tolist())

    outputs = {}
    for tokenizer_threads in (0, 1):
        engine = TorchEngine(model, EnginePlan(torch.device("cpu"), "fp32", threads=1,
                                               tokenizer_threads=tokenizer_threads))
        outputs[tokenizer_threads] = streaming.run_streamed(engine, list(range(5)), features, forward, batch_size=2,
                                                            max_batch_tokens=100, pad_token_id=0)[1]
        assert len(started) == tokenizer_threads  # the thread started for the plan with one only
    assert outputs[0] == outputs[1]


def test_quiet_waiting_sets_passive_waiting_before_torch_loads_and_keeps_the_users_values():
    environ: dict[str, str] = {}
    assert T.quiet_waiting(environ, torch_loaded=False)
    assert environ == {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0"}
    environ = {"OMP_WAIT_POLICY": "ACTIVE"}
    T.quiet_waiting(environ, torch_loaded=False)
    assert environ["OMP_WAIT_POLICY"] == "ACTIVE"
    environ = {}
    assert not T.quiet_waiting(environ, torch_loaded=True) and environ == {}  # too late: libgomp has read it
    assert "OMP_WAIT_POLICY=PASSIVE" in T.waiting_state({"OMP_WAIT_POLICY": "PASSIVE"})
    assert "spins" in T.waiting_state({})


def run_python(code: str) -> str:
    env = {key: value for key, value in os.environ.items() if key not in T.WAIT_VARIABLES}
    env["PYTHONPATH"] = str(SRC)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return done.stdout.strip()


def test_inference_commands_set_passive_waiting_before_torch_is_imported():
    code = ("import os, sys\n"
            "from bertforge.cli import main\n"
            "print('torch' in sys.modules)\n"
            "main([{args}])\n"
            "print(os.environ.get('OMP_WAIT_POLICY'))\n")
    predict = run_python(code.format(args="'predict', '--model', '/nonexistent', '--task', 'classify'"))
    assert predict.splitlines() == ["False", "PASSIVE"]  # torch not yet loaded when the policy was set
    info = run_python(code.format(args="'info', '/nonexistent'"))
    assert info.splitlines() == ["False", "None"]  # not an inference command: left as it was


def test_inference_commands_hold_every_subcommand_with_an_engine_flag():
    from bertforge.cli import INFERENCE_COMMANDS, build_parser

    parser = build_parser()
    commands = next(action for action in parser._actions if action.__class__.__name__ == "_SubParsersAction")
    with_engine = {name for name, sub in commands.choices.items()
                   if any("--engine" in action.option_strings for action in sub._actions)}
    assert with_engine <= set(INFERENCE_COMMANDS) <= set(commands.choices)  # and search, which embeds queries


# --- --engine auto ---------------------------------------------------------------------------------------

AMD_EPYC = "vendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx avx2 fma\n"
INTEL_AVX512 = "vendor_id\t: GenuineIntel\nflags\t\t: fpu sse2 avx avx2 avx512f avx512bw amx_tile\n"
INTEL_AVX2 = "vendor_id\t: GenuineIntel\nflags\t\t: fpu sse2 avx avx2 fma\n"


def test_auto_picks_the_engine_measured_faster_for_the_cpu_and_says_why(monkeypatch):
    monkeypatch.delenv(ENGINE_VARIABLE, raising=False)
    if any(importlib.util.find_spec(name) is None for name in ("onnx", "onnxruntime")):
        pytest.skip("the export extra is not installed")
    cpu = torch.device("cpu")
    kind, why = choose_kind(cpu, "fp32", AMD_EPYC)
    assert kind == "onnxruntime" and "engine auto: onnxruntime (fp32 on a AuthenticAMD" in why
    assert choose_kind(cpu, "fp32", INTEL_AVX2)[0] == "onnxruntime"
    kind, why = choose_kind(cpu, "fp32", INTEL_AVX512)
    assert kind == "torch" and "an Intel CPU with AVX-512" in why
    plan = plan_engine("cpu", "fp32")  # this machine's CPU decides
    assert plan.auto and plan.kind == choose_kind(cpu, "fp32")[0] and "engine auto: " + plan.kind in plan.reason
    assert plan_engine("cpu", "fp32", "torch").kind == "torch"  # --engine torch still works
    assert not plan_engine("cpu", "fp32", "onnxruntime").auto


def test_auto_picks_torch_where_onnxruntime_is_not_the_faster_or_cannot_run(monkeypatch):
    monkeypatch.delenv(ENGINE_VARIABLE, raising=False)
    assert choose_kind(torch.device("cpu"), "int8", AMD_EPYC)[0] == "torch"
    assert choose_kind(torch.device("cpu"), "bf16", AMD_EPYC)[0] == "torch"
    kind, why = choose_kind(torch.device("cuda"), "bf16")
    assert kind == "torch" and "onnxruntime runs on the CPU only" in why
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    kind, why = choose_kind(torch.device("cpu"), "fp32", AMD_EPYC)
    assert kind == "torch" and "onnxruntime not installed" in why and "pip install 'bertforge[export]'" in why


def test_cpu_kind_reads_vendor_and_flags():
    from bertforge.engine.build import cpu_kind

    vendor, flags = cpu_kind(INTEL_AVX512 + "\nvendor_id\t: GenuineIntel\nflags\t\t: other\n")  # first CPU's
    assert vendor == "GenuineIntel" and {"avx512f", "amx_tile"} <= flags
    assert cpu_kind("") == ("", set())


def test_engine_variable_pins_what_auto_picks_and_is_checked(monkeypatch):
    monkeypatch.setenv(ENGINE_VARIABLE, "torch")
    plan = plan_engine("cpu", "fp32")
    assert plan.kind == "torch" and f"engine torch: {ENGINE_VARIABLE}" in plan.reason
    monkeypatch.setenv(ENGINE_VARIABLE, "tensorrt")
    with pytest.raises(ConfigError, match=f"{ENGINE_VARIABLE}='tensorrt' is not an engine"):
        plan_engine("cpu", "fp32")


def test_auto_runs_on_pytorch_a_call_the_graph_cannot_take(monkeypatch):
    from bertforge.engine.build import build_engine
    from bertforge.model.bert import BertModel
    from conftest import make_tiny_config

    pytest.importorskip("onnxruntime")
    monkeypatch.delenv(ENGINE_VARIABLE, raising=False)
    torch.manual_seed(0)
    model = BertModel(make_tiny_config()).eval()
    ids = torch.tensor([[2, 7, 3]])
    with torch.inference_mode():
        expected = model(ids, output_hidden_states=True).hidden_states
    plan = plan_engine("cpu", "fp32", "onnxruntime", 1)
    engine = build_engine(model, EnginePlan(plan.device, "fp32", "onnxruntime", 1, "auto's pick", 0, auto=True))
    with engine.running():
        got = engine(ids, output_hidden_states=True).hidden_states  # embed's `layer` option: not in the graph
    assert engine.graph is None  # nothing was exported for it
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)
