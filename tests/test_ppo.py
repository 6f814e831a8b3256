"""ppo.py: GAE, whitening, the per-token rewards, the clipped losses and the KL controller on hand-computed numbers;
the value model's start; then end to end: what a run writes, exact resume (the KL coefficient and the value model
too), micro-batching, the stop token, LoRA, a reward model with another tokenizer, bad input, and a run that learns."""

import dataclasses
import json
import math

import pytest
import torch
from accelerate import Accelerator
from safetensors.torch import load_file
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    LlamaConfig,
    LlamaForSequenceClassification,
    PreTrainedTokenizerFast,
)

import common
import ppo
from conftest import EMBEDDED, ROOT, error_line, one_line_error, read_metrics, run_script
from hub_like import CHAT_TEMPLATE, SPECIAL
from ppo import (
    adaptive_kl_coef,
    ends_with,
    gae_advantages,
    masked_moments,
    masked_whiten,
    per_token_kl,
    per_token_rewards,
    policy_loss,
    value_loss,
)

VANILLA_PG = dict(
    lam=1.0, gamma=1.0, num_ppo_epochs=1, num_mini_batches=1, whiten_advantages=False
)


def args(tmp_path, **overrides) -> ppo.Args:
    """A run of a few seconds: 2 steps of 4 prompts, 2 PPO epochs, no evaluation, no checkpoint."""
    small = dict(
        max_steps=2,
        prompts_per_step=4,
        num_ppo_epochs=2,
        logging_steps=1,
        eval_strategy="no",
        save_steps=0,
    )
    return ppo.Args(**{**small, "output_dir": str(tmp_path / "out"), **overrides})


def training(output_dir) -> list[dict]:
    return [
        {k: v for k, v in r.items() if k != "step_time"}
        for r in read_metrics(output_dir)
        if "loss/value_avg" in r
    ]


# what each logged step holds, under TRL's names
TRL_METRICS = [
    "objective/kl",
    "objective/entropy",
    "objective/non_score_reward",
    "objective/rlhf_reward",
    "objective/scores",
    "objective/kl_coef",
    "policy/approxkl_avg",
    "policy/clipfrac_avg",
    "policy/entropy_avg",
    "loss/policy_avg",
    "loss/value_avg",
    "val/clipfrac_avg",
    "val/ratio",
    "val/ratio_var",
    "val/num_eos_tokens",
    "reward",
    "rewards/accuracy_reward/mean",
    "completions/mean_length",
    "completions/clipped_ratio",
    "grad_norm",
    "val/grad_norm",
    "learning_rate",
    "num_tokens",
]


# ---- the estimator, on hand-computed numbers ----
REWARDS = torch.tensor([[0.0, 0.0, 1.0]])
VALUES = torch.tensor([[0.5, 0.6, 0.7]])
FULL = torch.ones(1, 3)


def test_gae_on_the_docstrings_worked_example():
    # δ = (0 + 0.6 − 0.5, 0 + 0.7 − 0.6, 1 + 0 − 0.7) = (0.1, 0.1, 0.3); A_2 = 0.3, A_1 = 0.1 + 0.95 · 0.3, ...
    advantages, returns = gae_advantages(REWARDS, VALUES, FULL, gamma=1.0, lam=0.95)
    assert advantages.tolist()[0] == pytest.approx([0.46575, 0.385, 0.3])
    assert returns.tolist()[0] == pytest.approx([0.96575, 0.985, 1.0])
    # λ = 1: the return to go minus V
    advantages, returns = gae_advantages(REWARDS, VALUES, FULL, gamma=1.0, lam=1.0)
    assert advantages.tolist()[0] == pytest.approx([0.5, 0.4, 0.3])
    assert returns.tolist()[0] == pytest.approx([1.0] * 3)
    # λ = 0: the one-step TD error
    advantages, returns = gae_advantages(REWARDS, VALUES, FULL, gamma=1.0, lam=0.0)
    assert advantages.tolist()[0] == pytest.approx([0.1, 0.1, 0.3])
    assert returns.tolist()[0] == pytest.approx([0.6, 0.7, 1])
    # γ = 0.9: G = (0.81, 0.9, 1), A = G − V
    advantages, _ = gae_advantages(REWARDS, VALUES, FULL, gamma=0.9, lam=1.0)
    assert advantages.tolist()[0] == pytest.approx([0.31, 0.3, 0.3])


def test_gae_bootstraps_zero_after_the_last_real_token():
    rewards = torch.tensor([[0.0, 1.0, 5.0]])  # 5.0 and 9.0 sit on padding
    values = torch.tensor([[0.2, 0.4, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    advantages, returns = gae_advantages(rewards, values, mask, gamma=1.0, lam=0.95)
    assert advantages.tolist()[0] == pytest.approx([0.2 + 0.95 * 0.6, 0.6, 0.0])
    assert returns.tolist()[0] == pytest.approx([0.97, 1.0, 0.0])


def test_the_score_lands_on_the_last_real_token_and_the_kl_penalty_on_every_one():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    rewards = per_token_rewards(
        torch.tensor([1.0, 2.0, 3.0]), torch.ones(3, 4) * mask, mask, kl_coef=0.1
    )
    expected = torch.tensor(
        [[-0.1, -0.1, 0.9, 0.0], [1.9, 0.0, 0.0, 0.0], [-0.1, -0.1, -0.1, 2.9]]
    )
    torch.testing.assert_close(rewards, expected)


def test_a_completion_ends_at_its_first_end_token_and_has_stopped_only_at_the_stop_token(
    tiny_tokenizer,
):
    eos, stop, pad = 2, 32, 0
    ids = torch.tensor([[5, stop, 6, eos, 9], [5, 6, eos, stop, 9], [5, 6, 7, 8, 9]])
    mask, truncated = common.end_of_completion(ids, [eos, stop])  # ppo.py ends completions at both
    assert mask.tolist() == [[1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1] * 5]
    assert truncated.tolist() == [False, False, True]
    stopped = ends_with(ids.masked_fill(mask == 0, pad), mask, [stop])
    assert stopped.tolist() == [True, False, False]
    assert ppo.stop_token_ids(tiny_tokenizer, "eos", [2, 7]) == [2, 7]  # every end id
    assert ppo.stop_token_ids(tiny_tokenizer, ">", [2]) == [32]
    message = "--stop_token: '</answer>' is 3 tokens for this tokenizer, not one"
    with pytest.raises(ppo.BadInput, match=message):
        ppo.stop_token_ids(tiny_tokenizer, "</answer>", [2])


def test_whitening_reads_only_the_real_tokens():
    values = torch.tensor([[1.0, 2.0, 100.0], [3.0, 4.0, -50.0]])  # 100 and −50 sit on padding
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    mean, variance = masked_moments(values, mask, Accelerator())
    assert mean.item() == 2.5
    assert variance.item() == pytest.approx(5 / 3)
    whitened = masked_whiten(values, mask, Accelerator())
    assert whitened[mask.bool()].mean().item() == pytest.approx(0.0, abs=1e-6)
    assert whitened[mask.bool()].std().item() == pytest.approx(1.0, abs=1e-4)
    assert whitened[:, 2].tolist() == [0, 0]
    # --whiten_rewards: the mean stays
    scaled = masked_whiten(values, mask, Accelerator(), shift_mean=False)[mask.bool()]
    assert scaled.mean().item() == pytest.approx(2.5)
    assert scaled.std().item() == pytest.approx(1.0, abs=1e-4)


def test_kl_estimators_on_known_values():
    logprobs = torch.tensor([math.log(0.5)])
    ref_logprobs = torch.tensor([math.log(0.25)])
    assert per_token_kl(logprobs, ref_logprobs, "k1").item() == pytest.approx(math.log(2))
    k3 = per_token_kl(logprobs, ref_logprobs, "k3").item()
    assert k3 == pytest.approx(0.5 + math.log(2) - 1)


def test_the_clipped_policy_loss_has_no_gradient_outside_the_trust_region():
    # ρ ≈ 1.65 and 0.61 on the first token
    logprobs = torch.tensor([[0.5, 0.0], [-0.5, 0.0]], requires_grad=True)
    old_logprobs = torch.zeros(2, 2)
    advantages = torch.tensor([[1.0, 3.0], [-1.0, 3.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    loss, ratio, clipped = policy_loss(
        logprobs, old_logprobs, advantages, mask, torch.ones(2, 1), cliprange=0.2, num_tokens=2
    )
    loss.backward()
    # both clipped: A > 0, ρ > 1.2; A < 0, ρ < 0.8
    assert loss.item() == pytest.approx(-(1.2 * 1.0 + 0.8 * -1.0) / 2)
    assert clipped[:, 0].tolist() == [True, True]
    assert logprobs.grad.abs().sum().item() == 0.0
    weights = torch.tensor([[0.5], [2.0]])  # importance-sampling weights scale each completion's
    weighted, _, _ = policy_loss(
        logprobs, old_logprobs, advantages, mask, weights, cliprange=0.2, num_tokens=2
    )
    assert weighted.item() == pytest.approx(-(0.5 * 1.2 - 2.0 * 0.8) / 2)


def test_the_clipped_value_loss_on_known_values():
    values = torch.tensor([0.5, 0.5, -0.1], requires_grad=True)
    loss, clipped = value_loss(
        values,
        torch.zeros(3),
        torch.tensor([1.0, 0.4, 0.0]),
        torch.ones(3),
        cliprange_value=0.2,
        num_tokens=3,
    )
    loss.backward()
    # V = 0.5 is clipped to 0.2: (0.2 − 1)² = 0.64 > (0.5 − 1)², (0.2 − 0.4)² = 0.04 > (0.5 − 0.4)²; −0.1 is inside
    assert loss.item() == pytest.approx(0.5 * (0.64 + 0.04 + 0.01) / 3)
    assert clipped.tolist() == [True, True, False]
    assert values.grad.tolist() == pytest.approx([0, 0, -0.1 / 3])


def test_the_adaptive_kl_controller():
    update = lambda kl: adaptive_kl_coef(0.1, kl, kl_target=6.0, kl_horizon=10000, batch_size=1000)
    assert update(12.0) == pytest.approx(0.1 * 1.02)  # the error clipped
    assert update(3.0) == pytest.approx(0.1 * 0.98)
    assert update(6.6) == pytest.approx(0.1 * 1.01)
    assert update(6.0) == pytest.approx(0.1)


def test_the_vanilla_pg_flags_give_the_return_to_go_minus_the_value():
    """λ = 1, one update, no whitening: ∂L/∂log π(y_t) = −(G_t − V(s_t)) / N, G_t the KL-shaped return to go."""
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    kl = torch.tensor([[0.2, -0.1, 0.3], [0.5, 0.1, 0.0]])
    values = torch.tensor([[0.1, 0.3, 0.2], [0.4, -0.2, 0.0]])
    # (−0.1, 0.05, 0.85), (−0.25, −0.05)
    rewards = per_token_rewards(torch.tensor([1.0, 0.0]), kl, mask, kl_coef=0.5)
    gamma, lam = VANILLA_PG["gamma"], VANILLA_PG["lam"]
    advantages, _ = gae_advantages(rewards, values, mask, gamma=gamma, lam=lam)
    logprobs = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, 0.0]], requires_grad=True)
    old_logprobs = logprobs.detach()
    loss, ratio, _ = policy_loss(
        logprobs, old_logprobs, advantages, mask, torch.ones(2, 1), cliprange=0.2, num_tokens=5
    )
    loss.backward()
    return_to_go = [[0.8, 0.9, 0.85], [-0.3, -0.05, 0.0]]
    expected = [
        [-(g - v) / 5 * m for g, v, m in zip(*rows)]
        for rows in zip(return_to_go, values.tolist(), mask.tolist())
    ]
    assert ratio.tolist() == [[1.0] * 3] * 2
    torch.testing.assert_close(logprobs.grad, torch.tensor(expected))


# ---- the value model ----
def test_a_new_value_model_starts_at_zero_and_reads_every_position(tiny_tokenizer):
    value_model = ppo.load_value_model(Accelerator(), ppo.Args(), tiny_tokenizer)
    assert value_model.config.num_labels == 1
    assert value_model.score.weight.abs().sum().item() == 0.0  # V ≡ 0
    assert all(p.dtype == torch.float32 for p in value_model.parameters())
    torch.nn.init.normal_(value_model.score.weight)
    texts = ["<answer>7</answer>", "<answer>12</answer>"]
    enc = tiny_tokenizer(texts, return_tensors="pt", padding=True)
    # (B, 3): before each of the last 3 tokens
    values = ppo.completion_values(value_model, enc.input_ids, enc.attention_mask, 3)
    # the classifier's own forward reads the same head at the last position: V of the state
    # before the last token
    ids, mask = enc.input_ids[:, :-1], enc.attention_mask[:, :-1]
    last = value_model(input_ids=ids, attention_mask=mask).logits[:, 0]
    assert values.shape == (2, 3)
    assert values[:, -1].tolist() == pytest.approx(last.tolist(), abs=1e-5)


def small_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer of about 100 tokens, with hub_like's chat template: the policy's token ids go
    beyond its vocabulary, so a model of these tokens cannot read the policy's."""
    chars = SPECIAL + [chr(c) for c in range(32, 127)] + ["\n"]
    backend = Tokenizer(models.WordLevel({c: i for i, c in enumerate(chars)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        additional_special_tokens=SPECIAL[3:],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def make_reward_model(folder, other_tokenizer: bool) -> str:
    """A sequence classifier with one label: the embedded model's backbone with a random head, or a tiny Llama that
    reads `small_tokenizer`'s tokens."""
    if other_tokenizer:
        tokenizer = small_tokenizer()
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            num_labels=1,
        )
        model = LlamaForSequenceClassification(config)
    else:
        tokenizer = common.load_tokenizer(EMBEDDED)
        model = AutoModelForSequenceClassification.from_pretrained(EMBEDDED, num_labels=1)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_the_value_model_starts_from_the_reward_model(tmp_path, tiny_tokenizer):
    rm = make_reward_model(tmp_path / "rm", other_tokenizer=False)
    value_model = ppo.load_value_model(
        Accelerator(), ppo.Args(reward_model_path=rm), tiny_tokenizer
    )
    head = AutoModelForSequenceClassification.from_pretrained(rm).score.weight
    assert head.abs().sum() > 0
    assert torch.equal(value_model.score.weight, head)


def test_a_reward_model_with_another_tokenizer_scores_and_the_value_model_starts_from_the_policy(
    tmp_path, capsys
):
    """The reward model reads the decoded text through its own tokenizer; the value model, which reads the policy's
    tokens, starts from the policy. As --value_model_path, such a model is one line."""
    rm = make_reward_model(tmp_path / "rm", other_tokenizer=True)
    ppo.main(args(tmp_path, max_steps=1, reward_funcs=["none"], reward_model_path=rm))
    said = "has another tokenizer than the policy's: V_ψ starts from the policy"
    assert said in capsys.readouterr().out
    (record,) = training(tmp_path / "out")
    assert record["objective/scores"] == pytest.approx(record["rewards/rm/mean"])
    assert record["loss/value_avg"] > 0
    value_config = AutoConfig.from_pretrained(tmp_path / "out" / "value_model")
    assert value_config.model_type == "qwen2"  # the policy's
    flags = ["--value_model_path", rm, "--prompts_per_step", "4"]
    flags += ["--output_dir", tmp_path / "again"]
    assert "--value_model_path: " in one_line_error(ppo, *flags, capsys=capsys)


# ---- end to end ----
def test_a_run_writes_trls_ppo_metrics_the_value_model_and_checkpoints(tmp_path):
    flags = dict(save_steps=1, save_total_limit=1, kl_estimator="k3", num_mini_batches=2)
    ppo.main(args(tmp_path, **flags))
    out = tmp_path / "out"
    first, second = training(out)
    for key in TRL_METRICS:
        assert key in first, key
        assert key in second, key
    assert first["objective/kl"] == pytest.approx(0.0, abs=1e-6)  # step 1 samples from π_θ = π_ref
    assert second["objective/kl"] > 0
    assert second["objective/entropy"] > 0
    assert second["policy/entropy_avg"] > 0
    rlhf_reward = second["objective/scores"] + second["objective/non_score_reward"]
    assert second["objective/rlhf_reward"] == pytest.approx(rlhf_reward)
    assert [p.name for p in ppo.checkpoints(out)] == ["checkpoint-2"]
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["step"] == 2
    assert state["kl_coef"] == 0.05
    # in Hugging Face's format
    final = AutoModelForSequenceClassification.from_pretrained(out / "value_model")
    saved = AutoModelForSequenceClassification.from_pretrained(out / "checkpoint-2/value_model")
    assert final.config.num_labels == 1
    assert torch.equal(final.score.weight, saved.score.weight)
    assert final.score.weight.abs().sum() > 0  # trained from V ≡ 0
    assert AutoModelForCausalLM.from_pretrained(out).lm_head.weight.dtype == torch.float32


def test_resume_restores_the_kl_coefficient_and_the_value_model_exactly(tmp_path):
    """4 steps, and 2 steps then a resume from checkpoint-2, give the same metrics and the same two models: the
    optimizer, the scheduler, the RNG, the value model and the adaptive KL coefficient are all restored."""
    controller = dict(adaptive_kl=True, kl_target=0.01, kl_horizon=10)
    full = args(tmp_path, max_steps=4, save_steps=2, **controller)
    ppo.main(full)
    out = tmp_path / "out"
    names = ("model.safetensors", "value_model/model.safetensors")
    records = training(out)
    weights = {name: load_file(out / name) for name in names}
    # the controller moves it after every step
    assert len({r["objective/kl_coef"] for r in records}) == 4
    ppo.main(dataclasses.replace(full, resume_from_checkpoint=str(out / "checkpoint-2")))
    assert training(out) == records
    for name in names:
        again = load_file(out / name)
        assert all(torch.equal(weights[name][k], again[k]) for k in weights[name]), name


def test_micro_batching_does_not_change_the_update(tmp_path, recorded_gradients):
    """Whitening and the losses' token counts span the whole batch and mini-batch, so micro-batches of 2 accumulate
    the policy's and the value model's one-batch gradients."""
    whole = args(tmp_path, max_steps=1, num_ppo_epochs=1, output_dir=str(tmp_path / "a"))
    ppo.main(whole)
    ppo.main(dataclasses.replace(whole, micro_batch_size=2, output_dir=str(tmp_path / "b")))
    policy, value, policy_micro, value_micro = recorded_gradients
    for one_batch, micro_batches in ((policy, policy_micro), (value, value_micro)):
        assert one_batch.abs().max() > 0
        assert torch.allclose(one_batch, micro_batches, rtol=1e-4, atol=1e-7)


def test_the_missing_eos_penalty_goes_by_the_stop_token(tmp_path):
    """The embedded model ends its completions with <|im_end|>, never with <|endoftext|>: with that stop token, no
    completion has stopped, and each score is its reward minus the penalty."""
    ppo.main(args(tmp_path, max_steps=1, stop_token="<|endoftext|>", missing_eos_penalty=1.0))
    (record,) = training(tmp_path / "out")
    assert record["val/num_eos_tokens"] == 0
    assert record["completions/clipped_ratio"] < 1  # they ended, not stopped
    assert record["objective/scores"] == pytest.approx(record["reward"] - 1.0)


def test_kl_coef_zero_loads_no_reference_model(tmp_path, monkeypatch):
    loads = []
    load = AutoModelForCausalLM.from_pretrained

    def counted_load(*args, **kwargs):
        loads.append(args)
        return load(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", counted_load)
    ppo.main(args(tmp_path, max_steps=1, kl_coef=0.0))
    assert len(loads) == 1
    assert training(tmp_path / "out")[0]["objective/kl"] == 0.0


def test_lora_trains_adapters_of_both_models_and_resumes(tmp_path):
    lora = dict(use_peft=True, lora_r=4, learning_rate=1e-3)
    ppo.main(args(tmp_path, save_steps=1, **lora))
    out = tmp_path / "out"
    assert (out / "adapter_config.json").exists()
    assert not (out / "model.safetensors").exists()
    assert (out / "value_model" / "adapter_config.json").exists()
    # the reference: the adapter disabled
    assert training(out)[0]["objective/kl"] == pytest.approx(0.0, abs=1e-6)
    ppo.main(args(tmp_path, max_steps=3, resume_from_checkpoint="latest", **lora))
    assert [r["step"] for r in training(out)] == [1, 2, 3]


def test_a_non_finite_update_stops_before_it_is_applied(tmp_path, capsys):
    """A learning rate of 1e30 makes step 1's update blow the weights up: step 2's loss is not finite, and step 2 is
    not applied or saved."""
    flags = ["--learning_rate", "1e30", "--num_ppo_epochs", "1", "--max_steps", "3"]
    flags += ["--prompts_per_step", "4", "--eval_strategy", "no", "--save_steps", "1"]
    line = one_line_error(ppo, *flags, "--output_dir", tmp_path / "out", capsys=capsys)
    assert line.startswith("error: step 2: a loss or a gradient norm is not finite")
    assert [p.name for p in ppo.checkpoints(tmp_path / "out")] == ["checkpoint-1"]


@pytest.mark.parametrize(
    "flags, line",
    [
        (["--num_ppo_epochs", "0"], "--num_ppo_epochs: must be positive, got 0"),
        (["--lam", "1.5"], "--lam: must be in [0, 1], got 1.5"),
        (["--gamma", "-0.1"], "--gamma: must be in [0, 1], got -0.1"),
        (["--cliprange_value", "0"], "--cliprange_value: must be positive, got 0.0"),
        (
            ["--kl_estimator", "k2"],
            "--kl_estimator/--kl-estimator: invalid choice: 'k2' (choose from 'k1', 'k3')",
        ),
        (
            ["--kl_coef", "0", "--adaptive_kl"],
            "--adaptive_kl: needs a positive --kl_coef to start from",
        ),
        (["--num_mini_batches", "3"], "--num_mini_batches: must divide 4"),
        (
            ["--num_mini_batches", "2", "--micro_batch_size", "4"],
            "--micro_batch_size: must divide a mini-batch, 2",
        ),
        (
            ["--stop_token", "</answer>"],
            "--stop_token: '</answer>' is 3 tokens for this tokenizer, not one",
        ),
        (
            ["--load_in_4bit", "--use_peft"],
            "--load_in_4bit: ppo.py trains a value model beside the policy",
        ),
        (["--value_model_path", "/no/such/model"], "--value_model_path /no/such/model: "),
        (
            ["--lr_scheduler_type", "bogus"],
            "--lr_scheduler_type/--lr-scheduler-type: invalid choice: 'bogus'",
        ),
    ],
)
def test_bad_input_is_one_line_with_exit_status_2_and_nothing_written(
    tmp_path, flags, line, capsys
):
    out = tmp_path / "out"
    flags = [*flags, "--prompts_per_step", "4", "--eval_strategy", "no", "--output_dir", out]
    assert line in one_line_error(ppo, *flags, capsys=capsys)
    assert not out.exists() or not list(out.iterdir())


def test_the_script_itself_says_bad_input_in_one_line(tmp_path):
    result = run_script(ROOT / "ppo.py", "--lam", "2", "--output_dir", tmp_path / "out")
    assert error_line(result) == "error: --lam: must be in [0, 1], got 2.0"


@pytest.mark.slow
def test_the_default_run_learns(tmp_path):
    """`python ppo.py`, as the README says: held-out accuracy rises, sampled and greedy."""
    ppo.main(ppo.Args(output_dir=str(tmp_path / "out")))
    evals = [r for r in read_metrics(tmp_path / "out") if "eval/accuracy" in r]
    first, last = evals[0], evals[-1]
    assert last["eval/accuracy"] - first["eval/accuracy"] >= 0.15
    assert last["eval/accuracy_greedy"] >= first["eval/accuracy_greedy"]
