"""The accelerate config files in configs/ load with accelerate's own reader, and the DeepSpeed constraints are one
clear line each."""

import types
from pathlib import Path

import pytest
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
