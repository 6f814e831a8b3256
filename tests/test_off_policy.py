"""Samplers that are not the policy: the importance-sampling correction (TRL's `vllm_importance_sampling_*`) for vLLM
and the --bf16 copy, the sampler's own log-probs it reads, the LoRA weights vLLM gets (merged out of place: the frozen
base never moves), and a --vllm_max_model_length too short for a prompt and its completion."""

import dataclasses
import math

import pytest
import torch
from test_vllm import FakeLLM, fake_vllm  # noqa: F401 (a fixture)
from test_vllm import args as vllm_args

import common
import grpo
import ppo
import reinforce
import rloo
from common import ConfigError

SCRIPTS = [rloo, grpo, reinforce, ppo]
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.2, -0.7], [0.0, -0.3, -1.0]])  # log π_θ_old, (B, T)
SAMPLER = torch.tensor([[-1.5, -1.0, -9.0], [-0.1, -0.2, -0.7], [-1.2, -0.3, -5.0]])  # log π_sampler
MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 0]])
# Δ = old − sampler on the completion tokens: row 0: +0.5, −1.0 (sum −0.5); row 1: −0.2, 0, 0 (−0.2); row 2: +1.2, 0
# (+1.2, and exp(1.2) = 3.32 is above the cap C = 3). Outside the mask Δ counts as 0 (a weight of 1, never used).
EXPECTED = {
    "sequence_truncate": [[math.exp(-0.5)], [math.exp(-0.2)], [3.0]],
    "sequence_mask": [[math.exp(-0.5)], [math.exp(-0.2)], [0.0]],
    "token_truncate": [[math.exp(0.5), math.exp(-1.0), 1.0], [math.exp(-0.2), 1.0, 1.0], [3.0, 1.0, 1.0]],
    "token_mask": [[math.exp(0.5), math.exp(-1.0), 1.0], [math.exp(-0.2), 1.0, 1.0], [0.0, 1.0, 1.0]],
}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda m: m.__name__)
@pytest.mark.parametrize("mode", EXPECTED)
def test_importance_sampling_weights_by_hand(script, mode):
    """w = min(exp(Σ_t Δ_t), C) per completion, or min(exp(Δ_t), C) per token; the *_mask modes put 0 where the
    ratio is above C instead of C (TRL's four modes)."""
    weights = script.importance_sampling_weights(OLD, SAMPLER, MASK, mode=mode, clip_max=3.0)
    assert torch.allclose(weights, torch.tensor(EXPECTED[mode]), atol=1e-6)


def test_sampler_logprobs_are_those_of_the_logits_each_token_was_drawn_from(tiny_model, tiny_tokenizer):
    """`generate` reads the sampler's log softmax(logits / τ) at each drawn token while it samples: the log-probs a
    full forward pass of the same model gives (float32, so only the KV cache's rounding differs)."""
    config = common.sampling_config(tiny_model, tiny_tokenizer, rloo.Args(temperature=0.7, max_completion_length=12))
    texts = [common.prompt_text(tiny_tokenizer, p) for p in common.arithmetic_dataset("train")["prompt"][:6]]
    out = common.generate(tiny_model.eval(), tiny_tokenizer, texts, config, sampler_logprobs=True)
    mask, _ = rloo.end_of_completion(out["completion_ids"], tiny_tokenizer.eos_token_id)
    input_ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
    attention_mask = torch.cat([out["prompt_mask"], mask], 1)
    T = out["completion_ids"].shape[1]
    with torch.no_grad():
        logprobs = rloo.completion_logprobs(tiny_model, input_ids, attention_mask, T, 0.7)[0]
    assert out["sampler_logprobs"].shape == (6, T) and out["sampler_logprobs"].dtype == torch.float32
    assert ((logprobs - out["sampler_logprobs"]).abs() * mask).max() < 1e-5
    assert "sampler_logprobs" not in common.generate(tiny_model, tiny_tokenizer, texts, config)  # asked for only


def run(tmp_path, script, name, **overrides):
    group = {"num_ppo_epochs": 1} if script is ppo else {"num_generations": 2}  # one update: the first step's
    args = script.Args(
        max_steps=1,
        prompts_per_step=8 if script is ppo else 4,
        max_completion_length=12,
        eval_strategy="no",
        save_steps=0,
        logging_steps=1,
        reward_funcs="format",
        bf16=True,
        output_dir=str(tmp_path / name),
        **group,
    )
    script.main(dataclasses.replace(args, **overrides))
    (record,) = common.read_metrics(str(tmp_path / name))
    return record


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda m: m.__name__)
def test_bf16_runs_log_the_gap_and_weight_the_loss(tmp_path, script):
    """--bf16 samples from a bf16 copy of the policy: the run logs TRL's sampling/* metrics, a small gap and weights
    near 1. With a cap C far below every ratio, sequence_truncate weighs every completion by the cap: the same samples
    (the same seed) give the loss and the gradient (its norm before clipping) times the cap, and sequence_mask zeroes
    both. Without the correction nothing is logged."""
    off = run(tmp_path, script, "off", vllm_importance_sampling_correction=False)
    on = run(tmp_path, script, "on")
    assert 0 < on["sampling/sampling_logp_difference/mean"] < 0.01
    assert on["sampling/sampling_logp_difference/max"] >= on["sampling/sampling_logp_difference/mean"]
    ratios = [on[f"sampling/importance_sampling_ratio/{key}"] for key in ("min", "mean", "max")]
    assert 0.5 < ratios[0] <= ratios[1] <= ratios[2] < 2
    assert not any(key.startswith("sampling/") for key in off)
    loss = "loss/policy_avg" if script is ppo else "loss"
    cap = 2**-10  # scaling by a power of two is exact, in bf16 too
    capped = run(tmp_path, script, "capped", vllm_importance_sampling_mode="sequence_truncate", **{CAP: cap})
    assert off["grad_norm"] > 0 and capped["grad_norm"] == pytest.approx(cap * off["grad_norm"], rel=1e-6)
    assert capped[loss] == pytest.approx(cap * off[loss], rel=1e-6, abs=1e-12)
    masked = run(tmp_path, script, "masked", **{CAP: cap})
    assert masked["grad_norm"] == 0 and masked[loss] == 0


CAP = "vllm_importance_sampling_clip_max"


def test_only_a_sampler_that_is_not_the_policy_reports_log_probs(tiny_tokenizer, tmp_path):
    """The bf16 copy (`bf16_sampler`) reports its log-probs of the sampled tokens; the policy sampling itself (no
    --bf16; or --bf16 --use_peft) computes none: its weights are exactly 1."""
    args = rloo.Args(max_completion_length=4, bf16=True, output_dir=str(tmp_path))
    accelerator = common.make_accelerator(args)
    policy = common.load_causal_lm(common.EMBEDDED_MODEL)
    sampler = common.bf16_sampler(accelerator, policy, args)
    config = common.sampling_config(policy, tiny_tokenizer, args)
    out = common.sample_completions(accelerator, policy, tiny_tokenizer, ["x", "y"], config, sampler=sampler)
    assert out["sampler_logprobs"].shape == out["completion_ids"].shape
    assert "sampler_logprobs" not in common.sample_completions(accelerator, policy, tiny_tokenizer, ["x"], config)


@pytest.mark.parametrize(
    "script, mode, message",
    [
        (rloo, "token_mask", "--vllm_importance_sampling_mode: the whole completion is one action"),
        (reinforce, "token_truncate", "--vllm_importance_sampling_mode: the whole completion is one action"),
        (grpo, "sequence", "--vllm_importance_sampling_mode: must be one of sequence_mask"),
    ],
)
def test_a_mode_a_script_cannot_apply_is_one_line(tmp_path, script, mode, message):
    args = script.Args(output_dir=str(tmp_path / "out"), vllm_importance_sampling_mode=mode)
    with pytest.raises(ConfigError, match=message):
        script.main(args)


def test_vllm_reports_the_log_probs_of_its_tokens(tmp_path, fake_vllm):  # noqa: F811
    """vLLM is asked for the sampled token's log-prob after the temperature (TRL's processed_logprobs), which the
    rollout carries, padded like the ids; a run logs the gap to the policy (the stand-in engine computes them with the
    weights it was given, so the gap is float noise)."""
    from vllm_colocate import VLLMGenerator

    args = vllm_args(tmp_path, temperature=0.8)
    tokenizer = common.load_tokenizer(common.EMBEDDED_MODEL)
    model = common.load_causal_lm(common.EMBEDDED_MODEL)
    vllm = VLLMGenerator(common.make_accelerator(args), args, tokenizer, model, [tokenizer.eos_token_id])
    assert vllm.llm.kwargs["logprobs_mode"] == "processed_logprobs" and vllm.sampling_params.logprobs == 0
    out = vllm.generate(["a", "b", "c"], "cpu")
    (llm,) = FakeLLM.instances
    answer = out["completion_ids"][0][: (out["completion_ids"][0] == tokenizer.eos_token_id).int().argmax() + 1]
    expected = llm.logprobs(tokenizer("a", add_special_tokens=False).input_ids, answer.tolist(), 0.8)
    assert out["sampler_logprobs"].shape == out["completion_ids"].shape  # (B, T), T of the longest (prompt 2's)
    assert torch.allclose(out["sampler_logprobs"][0, : len(answer)], torch.tensor(expected))
    assert (out["sampler_logprobs"][0, len(answer) :] == 0).all()  # padding
    rloo.main(vllm_args(tmp_path, max_steps=1, overwrite_output_dir=True))
    record = next(r for r in common.read_metrics(str(tmp_path / "out")) if "loss" in r)
    assert 0 <= record["sampling/sampling_logp_difference/max"] < 1e-4
    assert record["sampling/importance_sampling_ratio/min"] == pytest.approx(1, abs=1e-3)


def test_lora_syncs_never_move_the_frozen_bf16_base(tmp_path, fake_vllm):  # noqa: F811
    """--use_peft --bf16 --use_vllm: each sync sends W + scale · B A built as new tensors. After many syncs the bf16
    base is bit-identical (merging into it and unmerging in place rounds it anew each time), and the engine holds the
    merged weights."""
    from peft import get_peft_model

    from vllm_colocate import VLLMGenerator

    args = vllm_args(tmp_path, use_peft=True, bf16=True)
    base_model = common.load_causal_lm(common.EMBEDDED_MODEL, dtype=torch.bfloat16)
    policy = get_peft_model(base_model, common.lora_config(args, base_model))
    for name, param in policy.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)  # a trained adapter: B ≠ 0
    base = {name: value.clone() for name, value in policy.state_dict().items() if "lora_" not in name}
    tokenizer = common.load_tokenizer(common.EMBEDDED_MODEL)
    vllm = VLLMGenerator(common.make_accelerator(args), args, tokenizer, policy, [tokenizer.eos_token_id])
    for _ in range(50):
        vllm.sync_weights(common.make_accelerator(args), policy)
    assert all(torch.equal(value, policy.state_dict()[name]) for name, value in base.items())
    q = policy.base_model.model.model.layers[0].self_attn.q_proj
    delta = q.lora_B["default"].weight @ q.lora_A["default"].weight * q.scaling["default"]
    expected = (q.base_layer.weight + delta).to(torch.bfloat16)
    loaded = vllm.llm.loads[-1]["model.layers.0.self_attn.q_proj.weight"]
    assert (
        loaded.dtype == torch.bfloat16
        and torch.equal(loaded, expected)
        and not torch.equal(loaded, base["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"])
    )


def test_a_vllm_context_too_short_for_prompt_and_completion_is_one_line(tmp_path, fake_vllm):  # noqa: F811
    """vLLM would stop a completion at its context limit with no end token (pads inside the mask, or a phantom EOS
    when pad = EOS): refused before anything runs; a context that holds the longest prompt and the completion runs."""
    tokenizer = common.load_tokenizer(common.EMBEDDED_MODEL)
    texts = [common.prompt_text(tokenizer, p) for p in common.arithmetic_dataset("train")["prompt"]]
    fits = max(len(ids) for ids in tokenizer(texts, add_special_tokens=False).input_ids) + 12  # --max_completion_length
    with pytest.raises(ConfigError, match=f"--vllm_max_model_length: {fits - 1} tokens do not hold the longest prompt"):
        rloo.main(vllm_args(tmp_path, vllm_max_model_length=fits - 1))
    assert not (tmp_path / "out").exists() and not FakeLLM.instances
    rloo.main(vllm_args(tmp_path, vllm_max_model_length=fits, max_steps=1))
    assert FakeLLM.instances[0].kwargs["max_model_len"] == fits
