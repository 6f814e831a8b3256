"""rloo.py under DeepSpeed ZeRO-2, ZeRO-3 and FSDP2 on two CPU processes, against one process.

accelerate enables DeepSpeed and FSDP only on a GPU, so tests/fixed_rollouts.py pins them over gloo on the CPU
(`pin_gloo_backend`), and samples fixed completions, so that every run trains on the same global batch. Each engine
runs from its shipped launch config (configs/, at 2 processes, float32) for two steps, with β > 0 (a reference model),
a --reward_model_path (a frozen reward model), advantages normalized over the batch, micro-batches (FSDP: DeepSpeed
takes its optimizer step at every backward pass, so rloo.py refuses them there) and a --max_grad_norm small enough
that clipping changes the update. Its updates and its logged statistics must be the one-process run's: --max_grad_norm
governs under DeepSpeed, which clips inside its engine, and ZeRO-3's partitioned frozen models score as the whole ones
do. A ZeRO-3 checkpoint (the engine's shards) resumes to the uninterrupted run's weights.

The runs hide any GPU (CUDA_VISIBLE_DEVICES=""), so they are CPU runs on every machine.
"""

import json

import pytest
import torch
from test_distributed import (
    FLAGS,
    assert_same_records,
    assert_same_update,
    launch,
    one_process,
    records,
    update,
)

import common
from conftest import EMBEDDED, ROOT

MAX_GRAD_NORM = 1e-4  # the first gradient's norm is ~100: clipped, most of its elements are near Adam's ε = 1e-8
ENGINE_FLAGS = [*FLAGS, "--max_grad_norm", MAX_GRAD_NORM]
MICRO_BATCHES = {
    config: ["--micro_batch_size", "2"]
    for config in ("deepspeed_zero2", "deepspeed_zero3", "fsdp")
}
ENGINES = {  # the launch config, and the engine that accelerate must set up from it
    "deepspeed_zero2": {
        "type": "DEEPSPEED",
        "processes": 2,
        "zero_stage": 2,
        "fsdp_version": None,
    },
    "deepspeed_zero3": {
        "type": "DEEPSPEED",
        "processes": 2,
        "zero_stage": 3,
        "fsdp_version": None,
    },
    "fsdp": {"type": "FSDP", "processes": 2, "zero_stage": None, "fsdp_version": 2},
}
PINNED = {"PIN_GLOO_BACKEND": "1", "DS_ACCELERATOR": "cpu"}


@pytest.fixture(scope="module")
def reward_model(tmp_path_factory) -> str:
    """A tiny reward model: the embedded model's backbone with a fresh (seeded) one-logit head."""
    from transformers import AutoModelForSequenceClassification

    # its rewards are logged as rewards/rm/mean
    path = tmp_path_factory.mktemp("reward-model") / "rm"
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_pretrained(EMBEDDED, num_labels=1).save_pretrained(
        path
    )
    common.load_tokenizer(EMBEDDED).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def one(tmp_path_factory, reward_model):
    """The one-process run: the whole batch in one micro-batch."""
    out = tmp_path_factory.mktemp("one")
    one_process(
        "rloo", out, *FLAGS, "--max_grad_norm", MAX_GRAD_NORM, "--reward_model_path", reward_model
    )
    return out


@pytest.mark.slow
def test_clipping_changes_the_update(one):
    """Adam's first step, lr · g / (|g| + ε), hardly depends on the scale of g except where |g| is near ε; clipped to
    1e-4, most nonzero elements of the first gradient are: an engine that clipped otherwise would update otherwise."""
    gradient = torch.load(one / "gradient.pt")
    clipped = (gradient * MAX_GRAD_NORM / gradient.norm())[gradient != 0]
    assert (clipped.abs() < 9e-8).float().mean() > 0.5  # |g| / (|g| + ε) < 0.9


def launch_engine(config: str, output_dir, reward_model: str, *flags):
    launcher = ["--config_file", ROOT / "configs" / f"{config}.yaml"]
    scorer = ["--reward_model_path", reward_model]
    flags = [*ENGINE_FLAGS, *MICRO_BATCHES.get(config, []), *scorer, *flags]
    launch("rloo", launcher, output_dir, *flags, env=PINNED)


def assert_the_one_process_run(one, run, config: str):
    assert json.loads((run / "engine.json").read_text()) == ENGINES[config]
    assert_same_update(update(run), update(one))
    # the same grad_norm, kl, rewards/rm/mean, learning_rate, ...
    assert_same_records(records(one), records(run))
    assert records(run)[2]["kl"] != 0
    assert not list(run.glob(".checkpoint-*"))


@pytest.mark.slow
@pytest.mark.parametrize("config", ["deepspeed_zero2", "fsdp"])
def test_the_engine_makes_the_one_process_updates(tmp_path, one, reward_model, config):
    launch_engine(config, tmp_path / "run", reward_model)
    assert_the_one_process_run(one, tmp_path / "run", config)


@pytest.mark.slow
def test_zero3_makes_the_one_process_updates_and_its_checkpoint_resumes_to_them(
    tmp_path, one, reward_model
):
    """ZeRO-3 partitions the frozen models too; its checkpoint holds the shards of the weights and of the optimizer."""
    run, resumed = tmp_path / "run", tmp_path / "resumed"
    launch_engine("deepspeed_zero3", run, reward_model)
    assert_the_one_process_run(one, run, "deepspeed_zero3")
    launch_engine(
        "deepspeed_zero3", resumed, reward_model, "--resume_from_checkpoint", run / "checkpoint-1"
    )
    assert torch.equal(update(resumed), update(run))
    assert_same_records(records(run)[2:], records(resumed), rel=1e-6)
