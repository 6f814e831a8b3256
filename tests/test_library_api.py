"""The libraries' current API: one step of each script with --gradient_checkpointing, with Python's warnings made
errors (transformers 5.25 deprecates gradient_checkpointing_enable) and no line from transformers about the cache
that checkpointing turns off."""

import importlib

import pytest
import transformers

SMALL = dict(max_steps=1, eval_strategy="no", save_steps=0, logging_steps=1)
RL = dict(prompts_per_step=2, max_completion_length=8)
FLAGS = {
    "rloo": dict(**RL, num_generations=2),
    "grpo": dict(**RL, num_generations=2, beta=0.04, entropy_coef=0.01),
    "reinforce": dict(**RL, num_generations=2),
    "ppo": dict(**RL),
    "sft": dict(train_batch_size=4),
    "reward_model": dict(train_batch_size=4),
}


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("script", FLAGS)
def test_a_step_with_gradient_checkpointing_is_silent(tmp_path, capfd, caplog, script):
    transformers.utils.logging.warning_once.cache_clear()  # it says each thing once per process
    module = importlib.import_module(script)
    flags = dict(SMALL, **FLAGS[script], output_dir=str(tmp_path / "out"))
    module.main(module.Args(**flags, gradient_checkpointing=True))
    said = capfd.readouterr().err + caplog.text
    assert "use_cache" not in said, said[-2000:]
    assert "incompatible" not in said, said[-2000:]
    assert (tmp_path / "out" / "config.json").is_file()
