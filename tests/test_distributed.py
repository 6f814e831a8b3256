"""The training scripts under `accelerate launch` with two CPU processes (DDP over gloo), against one process.

Sampling is made deterministic by tests/fixed_rollouts.py, so both runs train on the same global batch; the gradient of
the first update (after DDP's all-reduce) must then be the one-process gradient, which checks the prompt sharding,
the per-process loss normalization and the gathered statistics (normalized advantages, token counts). Only the main
process may write metrics.jsonl: each step appears once.

accelerate 1.15's `--cpu` flag starts a single process unless mpirun is used, so two CPU processes are launched as
`ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2` (torchrun underneath, gloo on the CPU).
"""

import dataclasses
import importlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import common

ROOT = Path(__file__).resolve().parents[1]
DRIVER = str(ROOT / "tests" / "fixed_rollouts.py")
FLAGS = {  # a few small steps each; --save_steps 1 so that resuming can be checked
    "rloo": ["--num_generations", "2", "--prompts_per_step", "4", "--normalize_advantages", "True", "--beta", "0.05"],
    "grpo": [
        "--num_generations",
        "2",
        "--prompts_per_step",
        "4",
        "--scale_rewards",
        "batch",
        "--loss_type",
        "dapo",
        "--beta",
        "0.05",
        "--micro_batch_size",
        "2",
    ],
    "reinforce": [
        "--num_generations",
        "2",
        "--prompts_per_step",
        "4",
        "--baseline",
        "moving_average",
        "--beta",
        "0.05",
        "--micro_batch_size",
        "2",
    ],
    # ppo: one completion per prompt, so the fixed ones earn no accuracy or format reward; the stop token "3" ends most
    # of them, and the others lose the missing-EOS penalty: scores and lengths differ between the processes' shares
    "ppo": [
        "--prompts_per_step",
        "4",
        "--num_ppo_epochs",
        "2",
        "--micro_batch_size",
        "1",
        "--whiten_rewards",
        "True",
        "--kl_coef",
        "0.05",
        "--adaptive_kl",
        "True",
        "--kl_target",
        "0.01",
        "--kl_horizon",
        "10",
        "--stop_token",
        "3",
        "--missing_eos_penalty",
        "1.0",
    ],
    "sft": ["--train_batch_size", "8", "--samples_per_problem", "1"],
    "reward_model": ["--train_batch_size", "8", "--pairs_per_problem", "1", "--center_rewards_coefficient", "0.01"],
}
COMMON_FLAGS = [
    "--reward_funcs",
    "accuracy,format",
    "--max_steps",
    "2",
    "--max_completion_length",
    "24",
    "--eval_steps",
    "0",
    "--save_steps",
    "1",
    "--logging_steps",
    "1",
    "--num_generations_eval",
    "1",
    "--learning_rate",
    "1e-3",
]


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def run(script: str, output_dir: Path, num_processes: int, *extra: str) -> subprocess.CompletedProcess:
    accepted = {
        f"--{field.name}" for field in dataclasses.fields(importlib.import_module(script).Args)
    }  # sft, reward_model: no rewards
    common_flags = [
        x for flag, value in zip(COMMON_FLAGS[::2], COMMON_FLAGS[1::2]) if flag in accepted for x in (flag, value)
    ]
    flags = [script, *FLAGS[script], *common_flags, "--output_dir", str(output_dir), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "ACCELERATE_USE_CPU": "1"}
    if num_processes == 1:
        command = [sys.executable, DRIVER, *flags]
    else:
        command = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--multi_gpu",
            "--num_processes",
            str(num_processes),
            "--main_process_port",
            free_port(),
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            DRIVER,
            *flags,
        ]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def training_records(output_dir: Path) -> list[dict]:
    return [r for r in common.read_metrics(str(output_dir)) if "loss" in r or "loss/policy_avg" in r]


@pytest.mark.slow
@pytest.mark.parametrize("script", FLAGS)
def test_two_processes_make_the_one_process_update(tmp_path, script):
    run(script, tmp_path / "one", 1)
    run(script, tmp_path / "two", 2)
    one, two = torch.load(tmp_path / "one" / "gradient.pt"), torch.load(tmp_path / "two" / "gradient.pt")
    assert one.abs().max() > 0
    assert torch.allclose(one, two, rtol=1e-3, atol=1e-6), (one - two).abs().max()
    records_one, records_two = training_records(tmp_path / "one"), training_records(tmp_path / "two")
    assert [r["step"] for r in records_two] == [1, 2]  # one writer: each step once
    for a, b in zip(records_one, records_two):  # step 2 also checks that the first updates were the same
        for key in (
            "grad_norm",
            "reward",
            "num_tokens",
            "kl",
            "loss",
            "objective/kl",
            "loss/policy_avg",
            "loss/value_avg",
            "val/grad_norm",
            "accuracy",
        ):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-3, abs=1e-6), (a["step"], key)
    assert (tmp_path / "two" / "checkpoint-2" / "accelerator_state" / "random_states_1.pkl").is_file()
    assert (tmp_path / "two" / "config.json").is_file() or (tmp_path / "two" / "adapter_config.json").is_file()


@pytest.mark.slow
def test_two_process_resume_reproduces_the_run(tmp_path):
    run("rloo", tmp_path / "run", 2)
    run("rloo", tmp_path / "resumed", 2, "--resume_from_checkpoint", str(tmp_path / "run" / "checkpoint-1"))
    (a,), (b,) = [[r for r in training_records(tmp_path / d) if r["step"] == 2] for d in ("run", "resumed")]
    for key in ("grad_norm", "reward", "loss", "kl", "num_tokens"):
        assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
