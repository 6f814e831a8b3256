"""The accelerate config files in configs/ load with accelerate's own reader, and the DeepSpeed constraints are one
clear line each."""

import types
from pathlib import Path

import pytest
import torch
from accelerate import DistributedType
from accelerate.commands.config.config_args import load_config_from_file

import common
from common import ConfigError

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize(
    "name, distributed_type",
    [
        ("multi_gpu", DistributedType.MULTI_GPU),
        ("deepspeed_zero2", DistributedType.DEEPSPEED),
        ("deepspeed_zero3", DistributedType.DEEPSPEED),
        ("fsdp", DistributedType.FSDP),
    ],
)
def test_config_files_load(name, distributed_type):
    config = load_config_from_file(str(CONFIGS / f"{name}.yaml"))
    assert (
        config.distributed_type == distributed_type and config.mixed_precision == "bf16" and config.num_processes == 8
    )
    if distributed_type == DistributedType.DEEPSPEED:
        assert config.deepspeed_config["zero_stage"] == int(name[-1])
    if distributed_type == DistributedType.FSDP:
        assert config.fsdp_config["fsdp_version"] == 2


def test_the_deepspeed_constraint_is_one_line():
    deepspeed = types.SimpleNamespace(distributed_type=DistributedType.DEEPSPEED)
    with pytest.raises(ConfigError, match="^--micro_batch_size: under DeepSpeed"):
        common.check_backend(deepspeed, one_backward_per_update=False)
    common.check_backend(deepspeed, one_backward_per_update=True)
    common.check_backend(types.SimpleNamespace(distributed_type=DistributedType.MULTI_GPU), False)  # DDP: any


@pytest.mark.parametrize("kind", [DistributedType.DEEPSPEED, DistributedType.FSDP])
def test_two_models_in_one_optimizer_are_refused_under_deepspeed_and_fsdp(kind):
    """ppo.py's policy and value model share one AdamW: one line before anything is wrapped, never a traceback."""
    accelerator = types.SimpleNamespace(distributed_type=kind)
    policy, value = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)
    with pytest.raises(ConfigError, match=f"^accelerate launch: 2 models in one optimizer .* not {kind.value}$"):
        common.prepare_training(accelerator, common.Args(), 1, policy, value)
