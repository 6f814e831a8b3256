"""rloo.py on two processes under `accelerate launch` (DDP over gloo on the CPU), against one process.

tests/fixed_rollouts.py replaces sampling by fixed completions, so that both runs train on the same global batch. The
two-process update is then the one-process update: the first gradient (DDP's all-reduced mean, each process's half
accumulated from micro-batches that split groups), the weights after two updates (the learning-rate schedule
included), and every logged statistic, training and held-out, each gathered from both processes and written once.
A two-process run resumes from its checkpoint to the weights of the uninterrupted run.

`ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2` starts two CPU processes (torchrun, gloo).
"""

import importlib
import json
import os
import socket
import subprocess
import sys

import pytest
import torch
from accelerate import Accelerator
from safetensors.torch import load_file

import common
import fixed_rollouts
from conftest import EMBEDDED, ROOT, read_metrics, run_main

FLAGS = ["--num_generations", "2", "--prompts_per_step", "4", "--max_steps", "2", "--beta", "0.05",
         "--normalize_advantages", "True", "--reward_funcs", "accuracy,format", "--learning_rate", "1e-3",
         "--logging_steps", "1", "--save_steps", "1", "--eval_steps", "0", "--num_generations_eval", "2"]  # fmt: skip
DDP = ["--multi_gpu"]  # with ACCELERATE_USE_CPU=1
NO_PLUGIN = {"zero_stage": None, "fsdp_version": None}


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def launch(script: str, launcher: list[str], output_dir, *flags, env: dict | None = None):
    """`accelerate launch {launcher} --num_processes 2 tests/fixed_rollouts.py {script} {flags}`, on the CPU only."""
    accelerate = [sys.executable, "-m", "accelerate.commands.launch", *launcher, "--num_processes", "2",
                  "--num_machines", "1", "--mixed_precision", "no", "--main_process_port", free_port()]  # fmt: skip
    driver = [str(ROOT / "tests" / "fixed_rollouts.py"), script, *map(str, flags), "--output_dir", str(output_dir)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", **(env or {})}
    result = subprocess.run(accelerate + driver, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-8000:]


def one_process(script: str, output_dir, *flags):
    """`python tests/fixed_rollouts.py {script} {flags}`, in this process."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(common, "generate", fixed_rollouts.fixed_generate)
        patch.setattr(Accelerator, "clip_grad_norm_", fixed_rollouts.gradient_saver(output_dir))
        run_main(importlib.import_module(script), *flags, "--output_dir", output_dir)


def records(output_dir) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "step_time"} for r in read_metrics(output_dir)]


def assert_same_records(a: list[dict], b: list[dict], rel=1e-4):
    assert [sorted(r) for r in b] == [sorted(r) for r in a]
    for x, y in zip(a, b):
        assert y == pytest.approx(x, rel=rel, abs=1e-6), x["step"]


def assert_same_update(a: torch.Tensor, b: torch.Tensor):
    """Equal to float noise, which Adam's first steps, lr · m / (√v + ε), amplify where a gradient is near ε."""
    assert b.abs().max() > 0 and (a - b).norm() < 1e-3 * b.norm(), (a - b).abs().max()


def update(output_dir) -> torch.Tensor:
    """The weights' change from the embedded model's, flattened (a tied lm_head saved or not)."""
    start, final = load_file(f"{EMBEDDED}/model.safetensors"), load_file(output_dir / "model.safetensors")
    return torch.cat([(final[name] - start[name]).flatten() for name in start])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    one, two = tmp_path_factory.mktemp("one"), tmp_path_factory.mktemp("two")
    one_process("rloo", one, *FLAGS)
    launch("rloo", DDP, two, *FLAGS, "--micro_batch_size", "1", env={"ACCELERATE_USE_CPU": "1"})
    return one, two


@pytest.mark.slow
def test_two_processes_make_the_one_process_update(runs):
    one, two = runs
    assert json.loads((two / "engine.json").read_text()) == {"type": "MULTI_CPU", "processes": 2, **NO_PLUGIN}
    gradient = torch.load(one / "gradient.pt")
    assert gradient.abs().max() > 0
    torch.testing.assert_close(torch.load(two / "gradient.pt"), gradient, rtol=1e-3, atol=1e-5)
    assert_same_update(update(two), update(one))
    assert [r["step"] for r in records(two)] == [0, 1, 2, 2]  # the first evaluation, 2 steps, the last evaluation
    assert_same_records(records(one), records(two))
    assert records(one)[2]["kl"] != 0  # step 2: after an update, the reference model is not the policy


@pytest.mark.slow
def test_two_processes_resume_to_the_uninterrupted_run(runs, tmp_path):
    _, two = runs
    checkpoint = two / "checkpoint-1"
    states = sorted(path.name for path in (checkpoint / "state").glob("random_states_*"))
    assert states == ["random_states_0.pkl", "random_states_1.pkl"]  # each process's RNG
    assert not list(two.glob(".checkpoint-*"))  # each renamed into place once every process wrote its part
    resumed = tmp_path / "resumed"
    launch("rloo", DDP, resumed, *FLAGS, "--micro_batch_size", "1", "--resume_from_checkpoint", checkpoint,
           env={"ACCELERATE_USE_CPU": "1"})  # fmt: skip
    assert torch.equal(update(resumed), update(two))
    assert_same_records(records(two)[2:], records(resumed), rel=1e-6)  # step 2 and the last evaluation
