"""rloo.py on two processes under `accelerate launch` (DDP over gloo on the CPU), against one process.

tests/fixed_rollouts.py replaces sampling by fixed completions, so that both runs train on the same global batch. The
two-process update is then the one-process update: the first gradient (DDP's all-reduced mean, each process's half
accumulated from micro-batches that split groups), the weights after two updates (the learning-rate schedule
included), and every logged statistic, training and held-out, each gathered from both processes and written once.
A two-process run resumes from its checkpoint to the weights of the uninterrupted run. Every script's two-process run
exits once its model is saved: end_training frees the process group (tests/fixed_rollouts.py's `check_end_training`).

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

FLAGS = "--num_generations 2 --prompts_per_step 4 --max_steps 2 --beta 0.05".split()
FLAGS += "--normalize_advantages True --reward_funcs accuracy,format --learning_rate 1e-3".split()
FLAGS += "--logging_steps 1 --save_steps 1 --eval_steps 0 --num_generations_eval 2".split()
DDP = ["--multi_gpu"]  # with CPU_DDP's environment
CPU_DDP = {"ACCELERATE_USE_CPU": "1", "CHECK_END_TRAINING": "1"}
NO_PLUGIN = {"zero_stage": None, "fsdp_version": None}


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def launch(
    script: str, launcher: list[str], output_dir, *flags, env: dict | None = None, timeout=300
):
    """`accelerate launch {launcher} --num_processes 2 tests/fixed_rollouts.py {script} {flags}`, on the CPU only."""
    accelerate = [sys.executable, "-m", "accelerate.commands.launch", *launcher]
    accelerate += "--num_processes 2 --num_machines 1 --mixed_precision no".split()
    accelerate += ["--main_process_port", free_port()]
    driver = [str(ROOT / "tests" / "fixed_rollouts.py"), script, *map(str, flags)]
    driver += ["--output_dir", str(output_dir)]
    cpu_only = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    env = {**os.environ, **cpu_only, **(env or {})}
    result = subprocess.run(
        accelerate + driver, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
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
    assert b.abs().max() > 0
    assert (a - b).norm() < 1e-3 * b.norm(), (a - b).abs().max()


def update(output_dir) -> torch.Tensor:
    """The weights' change from the embedded model's, flattened (a tied lm_head saved or not)."""
    start = load_file(f"{EMBEDDED}/model.safetensors")
    final = load_file(output_dir / "model.safetensors")
    return torch.cat([(final[name] - start[name]).flatten() for name in start])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    one, two = tmp_path_factory.mktemp("one"), tmp_path_factory.mktemp("two")
    one_process("rloo", one, *FLAGS)
    launch("rloo", DDP, two, *FLAGS, "--micro_batch_size", "1", env=CPU_DDP)
    return one, two


@pytest.mark.slow
def test_two_processes_make_the_one_process_update(runs):
    one, two = runs
    engine = {"type": "MULTI_CPU", "processes": 2, **NO_PLUGIN}
    assert json.loads((two / "engine.json").read_text()) == engine
    gradient = torch.load(one / "gradient.pt")
    assert gradient.abs().max() > 0
    torch.testing.assert_close(torch.load(two / "gradient.pt"), gradient, rtol=1e-3, atol=1e-5)
    assert_same_update(update(two), update(one))
    # the first evaluation, 2 steps, the last evaluation
    assert [r["step"] for r in records(two)] == [0, 1, 2, 2]
    assert_same_records(records(one), records(two))
    # step 2: after an update, the reference model is not the policy
    assert records(one)[2]["kl"] != 0


@pytest.mark.slow
def test_two_processes_resume_to_the_uninterrupted_run(runs, tmp_path):
    _, two = runs
    checkpoint = two / "checkpoint-1"
    states = sorted(path.name for path in (checkpoint / "state").glob("random_states_*"))
    assert states == ["random_states_0.pkl", "random_states_1.pkl"]  # each process's RNG
    # each renamed into place once every process wrote its part
    assert not list(two.glob(".checkpoint-*"))
    resumed = tmp_path / "resumed"
    resume = ["--micro_batch_size", "1", "--resume_from_checkpoint", checkpoint]
    launch("rloo", DDP, resumed, *FLAGS, *resume, env=CPU_DDP)
    assert torch.equal(update(resumed), update(two))
    # step 2 and the last evaluation
    assert_same_records(records(two)[2:], records(resumed), rel=1e-6)


BATCH = {  # a step's batch, one prompt (or sequence, or pair) per process; rloo.py: the launches above
    "grpo": ["--prompts_per_step", "2", "--num_generations", "2"],
    "reinforce": ["--prompts_per_step", "2"],
    "ppo": ["--prompts_per_step", "2"],
    "sft": ["--train_batch_size", "2"],
    "reward_model": ["--train_batch_size", "2"],
}


@pytest.mark.slow
@pytest.mark.parametrize("script", BATCH)
def test_two_processes_exit_once_the_model_is_saved(script, tmp_path):
    """end_training frees the process group and stops its gloo workers. A DDP wrapper that still held the group would
    stop them when freed, holding the GIL that a worker may need to free the last collective's tensors: the run would
    hang at exit in some tries (2 in 6 of reinforce.py's). CHECK_END_TRAINING fails every try in which the workers
    outlive end_training, not only those that hang."""
    flags = ["--max_steps", "1", "--eval_strategy", "no", "--save_steps", "0", *BATCH[script]]
    launch(script, DDP, tmp_path, *flags, env=CPU_DDP, timeout=120)
