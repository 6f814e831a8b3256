"""rloo.py end to end: bad inputs, resume equality, micro-batch invariance, LoRA, Ctrl-C, and a run that learns."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import common
import rloo
from common import ConfigError

ROOT = Path(__file__).resolve().parents[1]
FAST = dict(
    prompts_per_step=4,
    num_generations=2,
    max_steps=2,
    eval_steps=0,
    logging_steps=1,
    save_steps=0,
    num_generations_eval=1,
)


def args(tmp_path, **overrides) -> rloo.Args:
    return rloo.Args(**{"output_dir": str(tmp_path / "out"), **FAST, **overrides})


def training_records(output_dir):
    return [{k: v for k, v in r.items() if k != "step_time"} for r in common.read_metrics(output_dir) if "reward" in r]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(num_generations=1), "--num_generations: the leave-one-out baseline needs at least 2"),
        (dict(prompts_per_step=3, micro_batch_size=4), "--micro_batch_size: 4 does not divide the batch of 6"),
        (dict(learning_rate=0.0), "--learning_rate: must be positive"),
        (dict(max_completion_length=0), "--max_completion_length: must be positive"),
        (dict(lr_scheduler_type="cosine_annealing"), "--lr_scheduler_type: unknown scheduler"),
        (dict(report_to="tensorbord"), "--report_to: unknown tracker 'tensorbord'"),
        (dict(kl_estimator="k2"), "--kl_estimator: must be k1 or k3"),
        (dict(model_name_or_path="/no/such/model"), "--model_name_or_path: cannot load a tokenizer"),
        (dict(dataset_name="/no/such/data.jsonl"), "--dataset_name: no such file"),
        (dict(reward_funcs="accuracy,bogus"), "--reward_funcs: unknown reward function 'bogus'"),
        (dict(reward_weights="1,2"), "--reward_weights: 2 weights for 1 reward functions"),
        (dict(resume_from_checkpoint="latest"), "--resume_from_checkpoint latest: no checkpoint"),
        (
            dict(resume_from_checkpoint="/no/such/checkpoint-3"),
            "--resume_from_checkpoint: /no/such/checkpoint-3 is not a checkpoint",
        ),
    ],
)
def test_bad_input_is_a_config_error_naming_the_flag(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        rloo.main(args(tmp_path, **overrides))
    assert not (tmp_path / "out").exists()  # nothing written


def test_dataset_without_prompt_column(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text('{"question": "1 + 1", "ground_truth": "2"}\n' * 8)
    with pytest.raises(ConfigError, match="--dataset_name: the dataset has no 'prompt' column"):
        rloo.main(args(tmp_path, dataset_name=str(data)))


def test_reward_function_errors_name_the_function(tmp_path):
    module = tmp_path / "bad_rewards.py"
    module.write_text(
        "def short(completions, **kw):\n    return [1.0]\n\ndef nan(completions, **kw):\n    return [float('nan')] * "
        "len(completions)\n"
    )
    training = dict(eval_strategy="no")  # a training step's batch of 8 (the evaluation would find them first)
    with pytest.raises(ConfigError, match="reward function short: returned 1 values for 8 completions"):
        rloo.main(args(tmp_path, reward_funcs=f"{module}:short", output_dir=str(tmp_path / "short"), **training))
    with pytest.raises(ConfigError, match="reward function nan: returned nan"):
        rloo.main(args(tmp_path, reward_funcs=f"{module}:nan", output_dir=str(tmp_path / "nan"), **training))


def test_cli_bad_input_prints_one_line_and_exits_2(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "rloo.py"), "--num_generations", "1", "--output_dir", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: --num_generations: the leave-one-out baseline needs at least 2 completions per prompt, got 1"
    ]
    assert not (tmp_path / "out").exists()


def test_resume_reproduces_the_uninterrupted_run(tmp_path):
    full = args(tmp_path, max_steps=4, save_steps=2, beta=0.1, num_iterations=2)
    rloo.main(full)
    resumed = dataclasses.replace(
        full, output_dir=str(tmp_path / "resumed"), resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2")
    )
    rloo.main(resumed)
    uninterrupted = training_records(tmp_path / "out")
    assert [r["step"] for r in uninterrupted] == [1, 2, 3, 4]
    assert training_records(tmp_path / "resumed") == uninterrupted[2:]
    final = load_file(tmp_path / "out" / "model.safetensors")
    again = load_file(tmp_path / "resumed" / "model.safetensors")
    assert all(torch.equal(final[k], again[k]) for k in final)


def test_micro_batching_does_not_change_the_update(tmp_path, recorded_gradients):
    """The advantages of the whole batch are known before the first backward pass, so accumulating over micro-batches
    that split groups (2 of each prompt's 4) gives the one-batch gradient, batch-wide normalization included."""
    gradients = recorded_gradients
    whole = args(
        tmp_path, max_steps=1, num_generations=4, normalize_advantages=True, output_dir=str(tmp_path / "whole")
    )
    rloo.main(whole)
    rloo.main(dataclasses.replace(whole, micro_batch_size=2, output_dir=str(tmp_path / "micro")))
    one_batch, micro_batches = gradients
    assert one_batch.abs().max() > 0
    assert torch.allclose(one_batch, micro_batches, rtol=1e-4, atol=1e-7)
    (ra,), (rb,) = training_records(tmp_path / "whole"), training_records(tmp_path / "micro")
    assert ra["loss"] == pytest.approx(rb["loss"], abs=1e-6)


def test_beta_zero_loads_no_reference_model(tmp_path, monkeypatch):
    loads = []
    original = common.load_causal_lm
    monkeypatch.setattr(common, "load_causal_lm", lambda *a, **k: loads.append(a) or original(*a, **k))
    rloo.main(args(tmp_path, beta=0.0, max_steps=1))
    assert len(loads) == 1
    assert "kl" not in training_records(tmp_path / "out")[0]  # no reference model, no KL (as grpo.py)
    rloo.main(args(tmp_path, beta=0.05, max_steps=1, output_dir=str(tmp_path / "with_ref")))
    assert len(loads) == 3


def test_metrics_use_trl_names_and_are_masked(tmp_path):
    rloo.main(
        args(
            tmp_path,
            max_steps=1,
            kl_estimator="k3",
            reward_funcs="accuracy,format",
            reward_weights="1.0,0.2",
            eval_steps=1,
            num_generations_eval=2,
        )
    )
    records = common.read_metrics(tmp_path / "out")
    (train,) = training_records(tmp_path / "out")
    for key in (
        "reward",
        "reward_std",
        "frac_reward_zero_std",
        "rewards/accuracy_reward/mean",
        "rewards/format_reward/std",
        "kl",
        "entropy",
        "clip_ratio/low_mean",
        "clip_ratio/low_min",
        "clip_ratio/high_mean",
        "clip_ratio/high_max",
        "clip_ratio/region_mean",
        "completions/mean_length",
        "completions/clipped_ratio",
        "completions/mean_terminated_length",
        "loss",
        "grad_norm",
        "learning_rate",
        "num_tokens",
        "step_time",
    ):
        assert key in records[1] or key in train, key
    assert train["entropy"] > 0 and train["kl"] >= 0  # k3 is non-negative; padding never enters
    assert train["completions/max_length"] <= 24
    assert [r["step"] for r in records if "eval/accuracy" in r] == [0, 1]


def test_lora_trains_an_adapter_and_saves_a_merged_model(tmp_path):
    from transformers import AutoModelForCausalLM

    rloo.main(args(tmp_path, use_peft=True, lora_r=4, learning_rate=1e-3, save_merged_model=True, save_steps=1))
    out = tmp_path / "out"
    assert (out / "adapter_config.json").exists() and not (out / "model.safetensors").exists()
    merged = AutoModelForCausalLM.from_pretrained(out / "merged")
    base = AutoModelForCausalLM.from_pretrained(common.EMBEDDED_MODEL)
    assert any(not torch.equal(p, q) for p, q in zip(merged.parameters(), base.parameters()))
    rloo.main(args(tmp_path, use_peft=True, lora_r=4, learning_rate=1e-3, max_steps=3, resume_from_checkpoint="latest"))
    assert [r["step"] for r in training_records(out)] == [1, 2, 3]


def test_ctrl_c_saves_a_checkpoint_and_exits_cleanly(tmp_path, interrupt_run):
    checkpoint = interrupt_run("rloo.py", tmp_path / "out", "reward")
    assert torch.load(checkpoint / "training_state.pt", weights_only=False)["step"] == int(
        checkpoint.name.split("-")[1]
    )


def test_standard_prompts_from_a_file_and_reward_columns(tmp_path):
    data = tmp_path / "data.jsonl"
    rows = [
        {
            "prompt": f"<|im_start|>user\n{common.arithmetic_question(a, '+', 2)}<|im_end|>\n<|im_start|>assistant\n",
            "ground_truth": str(a + 2),
        }
        for a in range(8)
    ]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    rloo.main(args(tmp_path, dataset_name=str(data), max_steps=1))
    (record,) = training_records(tmp_path / "out")
    assert 0.0 <= record["rewards/accuracy_reward/mean"] <= 1.0


@pytest.mark.slow
def test_quick_start_learns(tmp_path):
    """A shortened quick start (`--num_generations 4`) raises held-out sampled accuracy."""
    rloo.main(rloo.Args(output_dir=str(tmp_path / "out"), num_generations=4, max_steps=100, eval_steps=0))
    evals = [r for r in common.read_metrics(tmp_path / "out") if "eval/accuracy" in r]
    assert evals[-1]["eval/accuracy"] - evals[0]["eval/accuracy"] >= 0.1


def test_bf16_autocast_and_gradient_checkpointing_train(tmp_path):
    """The GPU recipe's flags on the CPU: bf16 autocast (through accelerate) and activation checkpointing give a
    finite, non-zero update and a saved float32 model."""
    rloo.main(args(tmp_path, bf16=True, gradient_checkpointing=True, beta=0.05, prompts_per_step=8))
    records = training_records(tmp_path / "out")
    assert all(r["grad_norm"] > 0 and r["loss"] is not None and r["kl"] is not None for r in records)
    saved = load_file(tmp_path / "out" / "model.safetensors")
    assert all(t.dtype == torch.float32 for t in saved.values())
