"""ppo.py: the estimator pieces against hand-computed numbers (GAE, score placement, stop token, whitening, clipping,
KL, the Vanilla PG reduction), then end to end: bad inputs, resume equality, micro-batching, LoRA, Ctrl-C, learning."""

import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import common
import ppo
from common import ConfigError
from ppo import (
    adaptive_kl_coef,
    ends_with,
    gae_advantages,
    masked_whiten,
    per_token_kl,
    per_token_rewards,
    policy_loss,
    value_loss,
)

ROOT = Path(__file__).resolve().parents[1]
FAST = dict(
    prompts_per_step=4,
    num_ppo_epochs=2,
    max_steps=2,
    eval_steps=0,
    logging_steps=1,
    save_steps=0,
    num_generations_eval=1,
    max_completion_length=16,
)
VANILLA_PG = dict(
    lam=1.0, gamma=1.0, num_ppo_epochs=1, num_mini_batches=1, whiten_advantages=False
)  # the documented flags


def args(tmp_path, **overrides) -> ppo.Args:
    return ppo.Args(**{"output_dir": str(tmp_path / "out"), **FAST, **overrides})


def training_records(output_dir):
    return [
        {k: v for k, v in r.items() if k != "step_time"}
        for r in common.read_metrics(output_dir)
        if "objective/scores" in r
    ]


# ---- GAE ------------------------------------------------------------------------------------------------------------
REWARDS = torch.tensor([[0.0, 0.0, 1.0]])
VALUES = torch.tensor([[0.5, 0.6, 0.7]])
FULL = torch.ones(1, 3)


def test_gae_hand_computed_example():
    # δ = (0 + 0.6 − 0.5, 0 + 0.7 − 0.6, 1 + 0 − 0.7) = (0.1, 0.1, 0.3); A_2 = 0.3, A_1 = 0.1 + 0.95·0.3, A_0 = 0.1 +
    # 0.95·A_1
    advantages, returns = gae_advantages(REWARDS, VALUES, FULL, gamma=1.0, lam=0.95)
    assert advantages.tolist()[0] == pytest.approx([0.46575, 0.385, 0.3])
    assert returns.tolist()[0] == pytest.approx([0.96575, 0.985, 1.0])


def test_gae_lambda_1_is_the_return_to_go_minus_the_value():
    advantages, returns = gae_advantages(REWARDS, VALUES, FULL, gamma=1.0, lam=1.0)
    assert advantages.tolist()[0] == pytest.approx([0.5, 0.4, 0.3])  # G_t = 1 for every t
    assert returns.tolist()[0] == pytest.approx([1.0, 1.0, 1.0])


def test_gae_lambda_0_is_the_one_step_td_error():
    advantages, returns = gae_advantages(REWARDS, VALUES, FULL, gamma=1.0, lam=0.0)
    assert advantages.tolist()[0] == pytest.approx([0.1, 0.1, 0.3])
    assert returns.tolist()[0] == pytest.approx([0.6, 0.7, 1.0])  # r_t + γ V_{t+1}


def test_gae_discounted():
    # γ = 0.9, λ = 1: G = (0.81, 0.9, 1), A = G − V
    advantages, _ = gae_advantages(REWARDS, VALUES, FULL, gamma=0.9, lam=1.0)
    assert advantages.tolist()[0] == pytest.approx([0.31, 0.3, 0.3])
    # γ = 0.9, λ = 0.5: δ = (0.04, 0.03, 0.3); A_1 = 0.03 + 0.45·0.3, A_0 = 0.04 + 0.45·A_1
    advantages, _ = gae_advantages(REWARDS, VALUES, FULL, gamma=0.9, lam=0.5)
    assert advantages.tolist()[0] == pytest.approx([0.04 + 0.45 * 0.165, 0.165, 0.3])


def test_gae_ignores_padding_and_bootstraps_zero_after_the_last_real_token():
    rewards = torch.tensor([[0.0, 1.0, 5.0]])  # 5.0 and 9.0 sit on padding
    values = torch.tensor([[0.2, 0.4, 9.0]])
    advantages, returns = gae_advantages(rewards, values, torch.tensor([[1.0, 1.0, 0.0]]), gamma=1.0, lam=0.95)
    assert advantages.tolist()[0] == pytest.approx([0.2 + 0.95 * 0.6, 0.6, 0.0])
    assert returns.tolist()[0] == pytest.approx([0.97, 1.0, 0.0])


# ---- per-token rewards, stop token, missing-EOS penalty -------------------------------------------------------------
def test_score_lands_on_the_last_real_token():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    rewards = per_token_rewards(torch.tensor([1.0, 2.0, 3.0]), torch.ones(3, 4) * mask, mask, kl_coef=0.1)
    torch.testing.assert_close(
        rewards, torch.tensor([[-0.1, -0.1, 0.9, 0.0], [1.9, 0.0, 0.0, 0.0], [-0.1, -0.1, -0.1, 2.9]])
    )


def cut(ids: torch.Tensor, end_ids: list[int], pad: int):
    """What ppo.py does with the sampled ids: end each completion at its first end token, padding after it."""
    mask, _ = ppo.end_of_completion(ids, end_ids)
    return ids.masked_fill(mask == 0, pad), mask


def test_score_lands_on_the_stop_token_of_a_generated_completion():
    """The EOS itself gets the score (TRL put it on the first padding token after EOS)."""
    eos, pad = 2, 0
    completion_ids, mask = cut(torch.tensor([[7, 8, eos, 9, 9]]), [eos], pad)
    rewards = per_token_rewards(torch.tensor([1.0]), torch.zeros(1, 5), mask, kl_coef=0.05)
    assert rewards.tolist() == [[0.0, 0.0, 1.0, 0.0, 0.0]] and completion_ids[0].tolist() == [7, 8, eos, pad, pad]
    assert ends_with(completion_ids, mask, eos).tolist() == [True]


def test_stop_token_other_than_eos():
    """With --stop_token X a completion ends at its first X or EOS; only one that ends with X has stopped."""
    eos, pad, stop = 2, 0, 32
    ids = torch.tensor([[5, stop, 6, eos, 9], [5, 6, eos, stop, 9], [5, 6, 7, 8, 9]])
    completion_ids, mask = cut(ids, [eos, stop], pad)
    assert ends_with(completion_ids, mask, stop).tolist() == [True, False, False]
    assert mask.tolist() == [[1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert completion_ids[0].tolist() == [5, stop, pad, pad, pad]
    # the default stop token is EOS: a completion has stopped exactly when it was not truncated
    completion_ids, mask = cut(ids, [eos], pad)
    assert ends_with(completion_ids, mask, eos).tolist() == [True, True, False]
    assert mask.tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1] * 5]


def test_stop_token_must_be_one_token(tiny_tokenizer):
    assert ppo.stop_token_ids(tiny_tokenizer, "eos", [2, 7]) == [2, 7]  # 'eos': every end id of the checkpoint
    assert ppo.stop_token_ids(tiny_tokenizer, ">", [2]) == tiny_tokenizer.encode(">", add_special_tokens=False)
    with pytest.raises(ConfigError, match="--stop_token: '</answer>' is 3 tokens"):
        ppo.stop_token_ids(tiny_tokenizer, "</answer>", [2])


def test_missing_eos_penalty_checks_the_configured_stop_token(tmp_path):
    """Every completion of the embedded model ends with EOS, never with '<|endoftext|>': with that stop token each one
    is penalized, so the score is the accuracy minus the penalty, and no completion counts as stopped."""
    ppo.main(args(tmp_path, max_steps=1, stop_token="<|endoftext|>", missing_eos_penalty=1.0))
    (record,) = training_records(tmp_path / "out")
    assert record["val/num_eos_tokens"] == 0 and record["completions/clipped_ratio"] == 1.0
    assert record["objective/scores"] == pytest.approx(record["rewards/accuracy_reward/mean"] - 1.0)
    ppo.main(args(tmp_path, max_steps=1, missing_eos_penalty=1.0, output_dir=str(tmp_path / "eos")))
    (record,) = training_records(tmp_path / "eos")
    truncated = record["completions/clipped_ratio"]  # no EOS within max_completion_length: rare
    assert record["val/num_eos_tokens"] == 4 * (1 - truncated)
    assert record["objective/scores"] == pytest.approx(record["rewards/accuracy_reward/mean"] - truncated)


# ---- whitening, KL, losses
# --------------------------------------------------------------------------------------------
def test_masked_whitening_uses_only_real_tokens():
    values = torch.tensor([[1.0, 2.0, 100.0], [3.0, 4.0, -50.0]])  # 100 and −50 are padding
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    whitened = masked_whiten(values, mask)
    real = whitened[mask.bool()]
    assert real.mean().item() == pytest.approx(0.0, abs=1e-6) and real.std().item() == pytest.approx(1.0, abs=1e-4)
    assert whitened[:, 2].tolist() == [0.0, 0.0]
    assert torch.allclose(whitened, masked_whiten(values.masked_fill(mask == 0, 7.0), mask))
    scaled = masked_whiten(values, mask, shift_mean=False)  # --whiten_rewards: the scale changes, the mean stays
    assert scaled[mask.bool()].mean().item() == pytest.approx(2.5) and scaled[
        mask.bool()
    ].std().item() == pytest.approx(1.0, abs=1e-4)


def test_kl_estimators_on_known_values():
    logprobs, ref_logprobs = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    assert per_token_kl(logprobs, ref_logprobs, "k1").item() == pytest.approx(math.log(2))
    assert per_token_kl(logprobs, ref_logprobs, "k3").item() == pytest.approx(0.5 + math.log(2) - 1)
    assert per_token_kl(ref_logprobs, logprobs, "k1").item() < 0 < per_token_kl(ref_logprobs, logprobs, "k3").item()


def test_policy_clipping_stops_the_gradient_outside_the_trust_region():
    old = torch.zeros(2, 2)
    logprobs = torch.tensor([[0.5, 0.0], [-0.5, 0.0]], requires_grad=True)  # ρ ≈ 1.65 and 0.61 on the first token
    mask = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    loss, ratio, clipped = policy_loss(
        logprobs, old, torch.tensor([[1.0, 3.0], [-1.0, 3.0]]), mask, cliprange=0.2, num_tokens=2
    )
    loss.backward()
    assert (
        logprobs.grad.abs().sum().item() == 0.0
    )  # A > 0 with ρ > 1.2 and A < 0 with ρ < 0.8: both clipped; padding none
    assert loss.item() == pytest.approx(-(1.2 * 1.0 + 0.8 * -1.0) / 2)
    assert clipped[:, 0].tolist() == [True, True]


def test_value_clipping():
    old = torch.zeros(3)
    values = torch.tensor([0.5, 0.5, -0.1], requires_grad=True)
    returns = torch.tensor([1.0, 0.4, 0.0])
    loss, clipped = value_loss(values, old, returns, torch.ones(3), cliprange_value=0.2, num_tokens=3)
    loss.backward()
    # V = 0.5 is clipped to 0.2: (0.2 − 1)² = 0.64 > (0.5 − 1)²; (0.2 − 0.4)² = 0.04 > (0.5 − 0.4)²; −0.1 is inside
    # the range
    assert loss.item() == pytest.approx(0.5 * (0.64 + 0.04 + 0.01) / 3)
    assert clipped.tolist() == [True, True, False]
    assert values.grad.tolist() == pytest.approx([0.0, 0.0, 0.5 * 2 * -0.1 / 3])


def test_adaptive_kl_controller():
    assert adaptive_kl_coef(0.1, kl=12.0, kl_target=6.0, kl_horizon=10000, batch_size=1000) == pytest.approx(
        0.1 * 1.02
    )  # error clipped to +0.2
    assert adaptive_kl_coef(0.1, kl=3.0, kl_target=6.0, kl_horizon=10000, batch_size=1000) == pytest.approx(
        0.1 * 0.98
    )  # and to −0.2
    assert adaptive_kl_coef(0.1, kl=6.6, kl_target=6.0, kl_horizon=10000, batch_size=1000) == pytest.approx(0.1 * 1.01)
    assert adaptive_kl_coef(0.1, kl=6.0, kl_target=6.0, kl_horizon=10000, batch_size=1000) == pytest.approx(0.1)


# ---- Vanilla PG
# ---------------------------------------------------------------------------------------------------------
def return_to_go(rewards: list[float]) -> list[float]:
    return [sum(rewards[t:]) for t in range(len(rewards))]


def test_vanilla_pg_flags_give_the_return_to_go_minus_value_gradient_on_log_probs():
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    kl = torch.tensor([[0.2, -0.1, 0.3], [0.5, 0.1, 0.0]])
    values = torch.tensor([[0.1, 0.3, 0.2], [0.4, -0.2, 0.0]])
    rewards = per_token_rewards(torch.tensor([1.0, 0.0]), kl, mask, kl_coef=0.5)
    advantages, _ = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0)
    logprobs = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, 0.0]], requires_grad=True)
    loss, ratio, _ = policy_loss(logprobs, logprobs.detach(), advantages, mask, cliprange=0.2, num_tokens=5)
    loss.backward()
    # by hand: r = (−0.1, 0.05, 1 − 0.15) and (−0.25, −0.05); G_t − V_t, and ∂L/∂log π_t = −(G_t − V_t) / N
    expected = [
        [-(g - v) / 5 for g, v in zip(return_to_go([-0.1, 0.05, 0.85]), [0.1, 0.3, 0.2])],
        [-(g - v) / 5 for g, v in zip(return_to_go([-0.25, -0.05]), [0.4, -0.2])] + [0.0],
    ]
    assert ratio.tolist() == [[1.0] * 3] * 2
    torch.testing.assert_close(logprobs.grad, torch.tensor(expected))


def test_vanilla_pg_gradient_on_the_model_equals_the_hand_computed_one(tiny_model, tiny_tokenizer):
    """One Vanilla-PG update of the embedded model: ∇L = −1/N Σ_t (G_t − V(s_t)) ∇ log π(y_t | s_t), with G_t summed by
    hand from the KL-shaped rewards and the values taken as given (they are the baseline, not differentiated)."""
    import copy

    model = copy.deepcopy(tiny_model)
    prompt = common.prompt_text(tiny_tokenizer, [{"role": "user", "content": common.arithmetic_question(3, "+", 4)}])
    texts = [prompt + "<answer>7</answer><|im_end|>", prompt + "<answer>9</answer><|im_end|>"]
    enc = tiny_tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    T = len(tiny_tokenizer("<answer>7</answer><|im_end|>", add_special_tokens=False).input_ids)
    mask = torch.ones(2, T)
    scores = torch.tensor([1.0, 0.0])
    kl = torch.linspace(-0.2, 0.3, 2 * T).view(2, T)
    values = torch.linspace(0.1, 0.6, 2 * T).view(2, T)

    logprobs = ppo.completion_logprobs(model, enc.input_ids, enc.attention_mask, T, 1.0)[0]
    advantages, _ = gae_advantages(
        per_token_rewards(scores, kl, mask, 0.05), values, mask, **{k: VANILLA_PG[k] for k in ("gamma", "lam")}
    )
    loss, _, _ = policy_loss(logprobs, logprobs.detach(), advantages, mask, cliprange=0.2, num_tokens=int(mask.sum()))
    ppo_grads = torch.autograd.grad(loss, list(model.parameters()))

    logprobs = ppo.completion_logprobs(model, enc.input_ids, enc.attention_mask, T, 1.0)[0]
    by_hand = 0.0
    for i in range(2):
        r = [-0.05 * kl[i, t].item() + (scores[i].item() if t == T - 1 else 0.0) for t in range(T)]
        for t, g in enumerate(return_to_go(r)):
            by_hand = by_hand + (g - values[i, t].item()) * logprobs[i, t]
    hand_grads = torch.autograd.grad(-by_hand / mask.sum(), list(model.parameters()))
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(ppo_grads, hand_grads))


def test_vanilla_pg_run_has_no_ratio_and_no_clipping(tmp_path):
    ppo.main(args(tmp_path, max_steps=1, **VANILLA_PG))
    (record,) = training_records(tmp_path / "out")
    assert record["val/ratio"] == pytest.approx(1.0) and record["val/ratio_var"] == pytest.approx(0.0, abs=1e-6)
    assert record["policy/clipfrac_avg"] == 0.0 and record["val/clipfrac_avg"] == 0.0


# ---- value model
# ----------------------------------------------------------------------------------------------------------
def test_value_model_from_a_causal_lm_starts_at_zero_and_reads_every_position(tiny_tokenizer):
    value_model = common.load_value_model(ppo.Args())
    assert value_model.score.weight.abs().sum().item() == 0.0
    torch.nn.init.normal_(value_model.score.weight)
    enc = tiny_tokenizer(["<answer>7</answer>"], return_tensors="pt", add_special_tokens=False)
    values = ppo.completion_values(value_model, enc.input_ids, enc.attention_mask, 3)
    # the sequence-classification forward reads the same head at the last position only
    assert values.shape == (1, 3)
    last = value_model(input_ids=enc.input_ids[:, :-1], attention_mask=enc.attention_mask[:, :-1]).logits[0, 0]
    assert values[0, -1].item() == pytest.approx(last.item(), abs=1e-5)


def test_value_model_errors_name_the_flag(tmp_path):
    with pytest.raises(ConfigError, match="--value_model_path: cannot load a value model from '/no/such/model'"):
        ppo.main(args(tmp_path, value_model_path="/no/such/model"))


# ---- end to end
# -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(prompts_per_step=6, num_mini_batches=4), "--num_mini_batches: 4 does not divide the batch of 6"),
        (
            dict(prompts_per_step=8, num_mini_batches=2, micro_batch_size=3),
            "--micro_batch_size: 3 does not divide the mini-batch of 4",
        ),
        (dict(learning_rate=0.0), "--learning_rate: must be positive"),
        (dict(lr_scheduler_type="bogus"), "--lr_scheduler_type: unknown scheduler 'bogus'"),
        (dict(num_ppo_epochs=0), "--num_ppo_epochs: must be ≥ 1"),
        (dict(lam=1.5), "--lam: must be in"),
        (dict(gamma=-0.1), "--gamma: must be in"),
        (dict(cliprange=0.0), "--cliprange: must be positive"),
        (dict(cliprange_value=-1.0), "--cliprange_value: must be positive"),
        (dict(kl_estimator="k2"), "--kl_estimator: must be k1 or k3"),
        (dict(kl_coef=0.0, adaptive_kl=True), "--adaptive_kl: needs a positive --kl_coef"),
        (dict(max_completion_length=0), "--max_completion_length: must be positive"),
        (dict(stop_token="</answer>"), "--stop_token: '</answer>' is 3 tokens"),
        (dict(model_name_or_path="/no/such/model"), "--model_name_or_path: cannot load a tokenizer"),
        (dict(dataset_name="/no/such/data.jsonl"), "--dataset_name: no such file"),
        (dict(reward_funcs="accuracy,bogus"), "--reward_funcs: unknown reward function 'bogus'"),
        (dict(reward_model_path="/no/such/rm"), "--reward_model_path: cannot load a reward model"),
        (dict(report_to="tensorbord"), "--report_to: unknown tracker 'tensorbord'"),
        (dict(resume_from_checkpoint="latest"), "--resume_from_checkpoint latest: no checkpoint"),
    ],
)
def test_bad_input_is_a_config_error_naming_the_flag(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        ppo.main(args(tmp_path, **overrides))
    assert not (tmp_path / "out").exists()  # nothing written


def test_cli_bad_input_prints_one_line_and_exits_2(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "ppo.py"), "--lam", "2", "--output_dir", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["error: --lam: must be in [0, 1], got 2.0"]


def test_resume_reproduces_the_uninterrupted_run(tmp_path):
    full = args(tmp_path, max_steps=4, save_steps=2, adaptive_kl=True, kl_target=0.01, kl_horizon=10)
    ppo.main(full)
    resumed = dataclasses.replace(
        full, output_dir=str(tmp_path / "resumed"), resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2")
    )
    ppo.main(resumed)
    uninterrupted = training_records(tmp_path / "out")
    assert [r["step"] for r in uninterrupted] == [1, 2, 3, 4]
    assert len({r["objective/kl_coef"] for r in uninterrupted}) > 1  # the controller state is part of the checkpoint
    assert training_records(tmp_path / "resumed") == uninterrupted[2:]
    for name in ("model.safetensors", "value_model/model.safetensors"):
        final, again = load_file(tmp_path / "out" / name), load_file(tmp_path / "resumed" / name)
        assert all(torch.equal(final[k], again[k]) for k in final)


def test_micro_batching_does_not_change_the_update(tmp_path):
    """Token means are taken over the whole mini-batch, so accumulating micro-batches gives the same update."""
    whole = args(tmp_path, max_steps=1, num_ppo_epochs=1, output_dir=str(tmp_path / "whole"))
    ppo.main(whole)
    ppo.main(dataclasses.replace(whole, micro_batch_size=1, output_dir=str(tmp_path / "micro")))
    for name in ("model.safetensors", "value_model/model.safetensors"):
        a, b = load_file(tmp_path / "whole" / name), load_file(tmp_path / "micro" / name)
        assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    (ra,), (rb,) = training_records(tmp_path / "whole"), training_records(tmp_path / "micro")
    assert ra["loss/value_avg"] == pytest.approx(rb["loss/value_avg"], rel=1e-4)


def test_kl_coef_zero_loads_no_reference_model(tmp_path, monkeypatch):
    loads = []
    original = common.load_causal_lm
    monkeypatch.setattr(common, "load_causal_lm", lambda *a, **k: loads.append(a) or original(*a, **k))
    ppo.main(args(tmp_path, kl_coef=0.0, max_steps=1))
    assert len(loads) == 1
    assert training_records(tmp_path / "out")[0]["objective/kl"] == 0.0


def test_metrics_use_trl_names_and_are_masked(tmp_path):
    ppo.main(
        args(
            tmp_path,
            max_steps=1,
            kl_estimator="k3",
            num_mini_batches=2,
            reward_funcs="accuracy,format",
            reward_weights="1.0,0.2",
            eval_steps=1,
            num_generations_eval=1,
        )
    )
    records = common.read_metrics(tmp_path / "out")
    (train,) = training_records(tmp_path / "out")
    for key in (
        "objective/scores",
        "objective/rlhf_reward",
        "objective/kl",
        "objective/non_score_reward",
        "objective/entropy",
        "policy/approxkl_avg",
        "policy/clipfrac_avg",
        "policy/entropy_avg",
        "loss/policy_avg",
        "loss/value_avg",
        "val/clipfrac_avg",
        "val/ratio",
        "val/ratio_var",
        "val/num_eos_tokens",
        "learning_rate",
        "rewards/format_reward/mean",
        "completions/mean_length",
        "completions/clipped_ratio",
        "grad_norm",
        "num_tokens",
        "step_time",
    ):
        assert key in records[1], key
    assert (
        train["objective/entropy"] > 0 and train["policy/entropy_avg"] > 0 and train["objective/kl"] >= 0
    )  # k3 ≥ 0; no padding
    assert train["objective/rlhf_reward"] == pytest.approx(
        train["objective/scores"] + train["objective/non_score_reward"]
    )
    assert train["completions/max_length"] <= 16
    assert [r["step"] for r in records if "eval/accuracy" in r] == [0, 1]


def test_lora_trains_adapters_and_resumes(tmp_path):
    from transformers import AutoModelForCausalLM

    ppo.main(
        args(
            tmp_path,
            use_peft=True,
            lora_r=4,
            learning_rate=1e-3,
            save_merged_model=True,
            save_steps=1,
            max_completion_length=24,
        )
    )
    out = tmp_path / "out"
    assert (out / "adapter_config.json").exists() and not (out / "model.safetensors").exists()
    assert (out / "value_model" / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(out / "merged")
    base = AutoModelForCausalLM.from_pretrained(common.EMBEDDED_MODEL)
    assert any(not torch.equal(p, q) for p, q in zip(merged.parameters(), base.parameters()))
    ppo.main(
        args(
            tmp_path,
            use_peft=True,
            lora_r=4,
            learning_rate=1e-3,
            max_steps=3,
            resume_from_checkpoint="latest",
            max_completion_length=24,
        )
    )
    assert [r["step"] for r in training_records(out)] == [1, 2, 3]


def test_ctrl_c_saves_a_checkpoint_and_exits_cleanly(tmp_path, interrupt_run):
    checkpoint = interrupt_run("ppo.py", tmp_path / "out", "objective/scores")
    state = torch.load(checkpoint / "training_state.pt", weights_only=False)
    assert state["step"] == int(checkpoint.name.split("-")[1]) and "kl_coef" in state
    assert (checkpoint / "value_model" / "model.safetensors").is_file()  # the value model, saved with the policy


def test_reward_model_as_the_reward_and_the_value_model_start(tmp_path):
    from transformers import AutoModelForSequenceClassification

    import reward_model

    rm_dir = tmp_path / "rm"
    reward_model.main(reward_model.Args(output_dir=str(rm_dir), max_steps=2, eval_steps=0, pairs_per_problem=1))
    value_model = common.load_value_model(ppo.Args(reward_model_path=str(rm_dir)))
    assert torch.equal(
        value_model.score.weight, AutoModelForSequenceClassification.from_pretrained(rm_dir).score.weight
    )
    ppo.main(args(tmp_path, max_steps=1, reward_funcs="none", reward_model_path=str(rm_dir)))
    (record,) = training_records(tmp_path / "out")
    assert "rewards/rm/mean" in record and record["objective/scores"] == pytest.approx(record["rewards/rm/mean"])


def test_a_lora_reward_model_starts_the_value_model_merged(tmp_path):
    from transformers import AutoModelForSequenceClassification

    import reward_model

    rm_dir = tmp_path / "rm"
    reward_model.main(
        reward_model.Args(
            output_dir=str(rm_dir),
            use_peft=True,
            lora_r=4,
            save_merged_model=True,
            max_steps=2,
            eval_steps=0,
            pairs_per_problem=1,
        )
    )
    value_model = common.load_value_model(ppo.Args(reward_model_path=str(rm_dir)))
    merged = AutoModelForSequenceClassification.from_pretrained(rm_dir / "merged")
    assert value_model.score.weight.abs().sum().item() > 0
    assert all(torch.allclose(p, q, atol=1e-6) for p, q in zip(value_model.parameters(), merged.parameters()))


# ---- learning (slow)
# ----------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_default_run_learns(tmp_path):
    """`python ppo.py` (the defaults) raises held-out sampled accuracy."""
    ppo.main(ppo.Args(output_dir=str(tmp_path / "out"), eval_steps=0))
    evals = [r for r in common.read_metrics(tmp_path / "out") if "eval/accuracy" in r]
    assert evals[-1]["eval/accuracy"] - evals[0]["eval/accuracy"] >= 0.15


@pytest.mark.slow
def test_vanilla_pg_learns(tmp_path):
    ppo.main(ppo.Args(output_dir=str(tmp_path / "out"), eval_steps=0, max_steps=40, **VANILLA_PG))
    evals = [r for r in common.read_metrics(tmp_path / "out") if "eval/accuracy" in r]
    assert evals[-1]["eval/accuracy"] - evals[0]["eval/accuracy"] >= 0.1


@pytest.mark.slow
def test_pipeline_reward_model_then_ppo_learns(tmp_path):
    """reward_model.py (defaults) → ppo.py --reward_model_path … --reward_funcs none: held-out accuracy rises although
    the policy never sees the accuracy reward."""
    import reward_model

    reward_model.main(reward_model.Args(output_dir=str(tmp_path / "rm")))
    ppo.main(
        ppo.Args(
            output_dir=str(tmp_path / "out"), reward_model_path=str(tmp_path / "rm"), reward_funcs="none", eval_steps=0
        )
    )
    evals = [r for r in common.read_metrics(tmp_path / "out") if "eval/accuracy" in r]
    assert evals[-1]["eval/accuracy"] - evals[0]["eval/accuracy"] >= 0.1
