"""DeepSpeed ZeRO-2, ZeRO-3 and FSDP2 on two CPU processes, against DDP; and launches accelerate cannot honour.

accelerate enables DeepSpeed and FSDP only on GPUs, so tests/fixed_rollouts.py pins them over gloo on the CPU
(`pin_gloo_backend`); sampling is made deterministic there too, so every run trains on the same global batch. Each
backend runs grpo.py from the shipped launch config (configs/, at 2 processes, float32) for two steps, with β > 0 (a
reference model), a --reward_model_path (a frozen reward model) and a --max_grad_norm small enough to clip: its
updates must be DDP's to float tolerance. That shows that --max_grad_norm governs under DeepSpeed (before, ZeRO-2
clipped nothing and ZeRO-3 at its config's `gradient_clipping`), that ZeRO-3 wraps the frozen models for inference
(unwrapped, their first forward fails: transformers partitioned them), and that DeepSpeed's logged grad_norm is DDP's.

Without the pin, accelerate replaces what it cannot honour (DeepSpeed and FSDP without a GPU, or DDP on CPUs without
ACCELERATE_USE_CPU=1) by N independent one-process runs into one folder: the scripts must say so and stop.

The runs hide any GPU (CUDA_VISIBLE_DEVICES=""), so they are CPU runs on every machine.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_distributed import free_port

import common

ROOT = Path(__file__).resolve().parents[1]
DRIVER = str(ROOT / "tests" / "fixed_rollouts.py")
MAX_GRAD_NORM = 1e-4  # the raw gradient's norm is ~30: the clipped one is small enough that Adam's ε matters
LEARNING_RATE = 1e-3
FLAGS = [
    "--num_generations",
    "2",
    "--prompts_per_step",
    "4",
    "--beta",
    "0.05",
    "--reward_funcs",
    "accuracy,format",
    "--max_steps",
    "2",
    "--max_completion_length",
    "24",
    "--eval_strategy",
    "no",
    "--save_steps",
    "0",
    "--logging_steps",
    "1",
    "--learning_rate",
    str(LEARNING_RATE),
    "--max_grad_norm",
    str(MAX_GRAD_NORM),
]
ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "DS_ACCELERATOR": "cpu"}


def launch(config: list[str], script: str, *flags: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`accelerate launch {config} --num_processes 2 {script} {flags}` on the CPU."""
    command = [sys.executable, "-m", "accelerate.commands.launch", *config, "--num_processes", "2"]
    command += ["--num_machines", "1", "--mixed_precision", "no", "--main_process_port", free_port(), script, *flags]
    env = {**os.environ, **ENV, **(env or {})}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)


@pytest.fixture(scope="module")
def reward_model_path(tmp_path_factory) -> str:
    """A tiny reward model: the embedded model's backbone with a fresh (seeded) one-logit head."""
    from transformers import AutoModelForSequenceClassification

    path = tmp_path_factory.mktemp("reward-model") / "rm"  # its rewards are logged as rewards/rm/...
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_pretrained(common.EMBEDDED_MODEL, num_labels=1).save_pretrained(path)
    common.load_tokenizer(common.EMBEDDED_MODEL).save_pretrained(path)
    return str(path)


def train(config: list[str], output_dir, reward_model_path: str, env: dict | None = None) -> dict:
    flags = ["grpo", *FLAGS, "--reward_model_path", reward_model_path, "--output_dir", str(output_dir)]
    result = launch(config, DRIVER, *flags, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [r for r in common.read_metrics(str(output_dir)) if "loss" in r]
    gradient = output_dir / "gradient.pt"  # the first raw gradient, saved under DDP only
    return {
        "records": records,
        "weights": load_file(output_dir / "model.safetensors"),
        "gradient": torch.load(gradient) if gradient.exists() else None,
    }


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory, reward_model_path) -> dict:
    return train(["--multi_gpu"], tmp_path_factory.mktemp("ddp"), reward_model_path, env={"ACCELERATE_USE_CPU": "1"})


@pytest.mark.slow
@pytest.mark.parametrize("config", ["deepspeed_zero2", "deepspeed_zero3", "fsdp"])
def test_backend_makes_the_ddp_updates_clipping_included(tmp_path, ddp_run, reward_model_path, config):
    config_file = ["--config_file", str(ROOT / "configs" / f"{config}.yaml")]
    run = train(config_file, tmp_path, reward_model_path, env={"PIN_GLOO_BACKEND": "1"})
    start = load_file(ROOT / "models" / "tiny-arith" / "model.safetensors")
    ddp_update = torch.cat([(ddp_run["weights"][k] - start[k]).flatten() for k in start])
    update = torch.cat([(run["weights"][k] - start[k]).flatten() for k in start])  # FSDP also saves the tied lm_head
    # clipping bites: Adam's first step, lr · g / (|g| + ε), hardly depends on the gradient's scale, except where the
    # clipped gradient is as small as ε; here that is most elements (the DDP run's raw first gradient)
    clipped = ddp_run["gradient"] * MAX_GRAD_NORM / ddp_run["gradient"].norm()
    assert ((clipped.abs() / (clipped.abs() + 1e-8)) < 0.9).float().mean() > 0.5
    torch.testing.assert_close(update, ddp_update, rtol=1e-3, atol=1e-6)
    assert [r["step"] for r in run["records"]] == [1, 2]
    for a, b in zip(ddp_run["records"], run["records"]):  # step 2: after the first update, β's KL is not 0
        for key in ("grad_norm", "kl", "loss", "reward", "rewards/rm/mean"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-7), (a["step"], key)
    assert run["records"][1]["kl"] > 0


LAUNCHED = {  # config: what was started, what accelerate set up on a CPU instead
    "fsdp": ("FSDP on 2", "NO"),
    "deepspeed_zero3": ("DEEPSPEED on 2", "DEEPSPEED"),  # DeepSpeed's batch check would fail: 2 ranks, 1 process
    "multi_gpu": ("2", "NO"),
}


@pytest.mark.slow
@pytest.mark.parametrize("config", LAUNCHED)
def test_a_launch_accelerate_cannot_honour_stops_in_one_line(tmp_path, config):
    out = tmp_path / "out"
    config_file = ["--config_file", str(ROOT / "configs" / f"{config}.yaml")]
    flags = ["--max_steps", "1", "--eval_strategy", "no", "--output_dir", str(out)]
    result = launch(config_file, DRIVER, "rloo", *flags)  # not pinned to gloo (and no DeepSpeed op to compile)
    assert result.returncode != 0
    launched, got = LAUNCHED[config]
    line = f"error: accelerate launch: started {launched} processes, but accelerate set up distributed type {got} on 1"
    assert result.stderr.count(line) == 2  # one from each process (their writes may interleave)
    assert 'common.py", line' not in result.stderr  # torchrun's own report follows, but no traceback of the script
    assert not out.exists()


@pytest.mark.parametrize("env", [{"ACCELERATE_USE_FSDP": "true"}, {}])
def test_processes_that_run_alone_stop_before_writing(tmp_path, monkeypatch, capsys, env):
    """What torchrun sets for 2 processes when accelerate leaves each alone: WORLD_SIZE=2, and accelerate (no LOCAL_RANK
    here, as without a GPU) runs one process."""
    import rloo

    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)  # else accelerate would wait for the other process
    for name, value in {"WORLD_SIZE": "2", **env}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as stop:
        common.cli(
            rloo.main, rloo.Args, ["--max_steps", "1", "--eval_strategy", "no", "--output_dir", str(tmp_path / "out")]
        )
    assert stop.value.code == 2
    launched = "FSDP on 2" if env else "2"
    assert capsys.readouterr().err.startswith(
        f"error: accelerate launch: started {launched} processes, but accelerate set up distributed type NO on 1"
    )
    assert not (tmp_path / "out").exists()
