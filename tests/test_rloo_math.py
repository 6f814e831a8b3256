"""RLOO's estimator pieces, against worked examples computed by hand (rloo.py's docstring)."""

import math

import pytest
import torch

from rloo import leave_one_out_advantages, per_token_kl, rloo_loss


def test_worked_example_rewards_10_8_4_2():
    advantages = leave_one_out_advantages(torch.tensor([10.0, 8.0, 4.0, 2.0]), 4)
    # baselines 4.67, 5.33, 6.67, 7.33 → advantages +5.33, +2.67, −2.67, −5.33, summing to 0
    assert advantages.tolist() == pytest.approx([16 / 3, 8 / 3, -8 / 3, -16 / 3])
    assert advantages.sum().item() == pytest.approx(0.0, abs=1e-6)


def test_rloo_advantage_is_g_over_g_minus_1_times_the_group_centered_reward():
    rewards = torch.tensor([10.0, 8.0, 4.0, 2.0])
    centered = rewards - rewards.mean()  # GRPO-style: 4, 2, −2, −4
    assert leave_one_out_advantages(rewards, 4).tolist() == pytest.approx(
        (4 / 3 * centered).tolist()
    )


def test_equal_rewards_give_zero_advantages():
    assert leave_one_out_advantages(torch.ones(4), 4).tolist() == [0.0] * 4
    assert leave_one_out_advantages(torch.zeros(4), 4).tolist() == [0.0] * 4


def test_paper_example_0_9_0_6_0_1_0_7():
    advantages = leave_one_out_advantages(torch.tensor([0.9, 0.6, 0.1, 0.7]), 4)
    assert advantages.tolist() == pytest.approx([0.433, 0.033, -0.633, 0.167], abs=5e-4)


def test_groups_are_independent():
    advantages = leave_one_out_advantages(torch.tensor([1.0, 0.0, 5.0, 5.0]), 2)
    assert advantages.tolist() == [1.0, -1.0, 0.0, 0.0]


def test_kl_estimators_on_known_values():
    logprobs = torch.tensor([math.log(0.5)])
    ref_logprobs = torch.tensor([math.log(0.25)])
    assert per_token_kl(logprobs, ref_logprobs, "k1").item() == pytest.approx(math.log(2))
    # k3 = exp(ref − logp) − (ref − logp) − 1 = 0.5 + log 2 − 1
    assert per_token_kl(logprobs, ref_logprobs, "k3").item() == pytest.approx(
        0.5 + math.log(2) - 1
    )
    # identical policies: both zero; k3 is never negative, k1 can be
    same = torch.tensor([-1.3])
    assert per_token_kl(same, same, "k1").item() == 0.0
    assert per_token_kl(same, same, "k3").item() == 0.0
    assert (
        per_token_kl(ref_logprobs, logprobs, "k1").item()
        < 0
        < per_token_kl(ref_logprobs, logprobs, "k3").item()
    )


def test_k1_and_k3_are_unbiased_estimates_of_the_kl():
    torch.manual_seed(0)
    p = torch.tensor([0.6, 0.3, 0.1])
    q = torch.tensor([0.3, 0.3, 0.4])
    exact = (p * (p / q).log()).sum()
    samples = torch.multinomial(p, 200_000, replacement=True)
    for estimator in ("k1", "k3"):
        estimate = per_token_kl(p.log()[samples], q.log()[samples], estimator).mean()
        assert estimate.item() == pytest.approx(exact.item(), abs=0.01)


def test_first_iteration_loss_is_reinforce_with_the_leave_one_out_baseline():
    """With old = logprobs.detach(), ρ ≡ 1 and ∇L = −1/B Σ_i A_i ∇ Σ_t log π(y_i,t)."""
    logprobs = torch.tensor(
        [[-1.0, -2.0], [-0.5, -0.1], [-3.0, -0.2], [-1.0, -1.0]], requires_grad=True
    )
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1]])
    advantages = leave_one_out_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), 2)
    loss, ratio = rloo_loss(
        logprobs,
        logprobs.detach(),
        mask,
        advantages,
        torch.ones(4) / 4,
        epsilon=0.2,
        epsilon_high=0.2,
    )
    loss.backward()
    assert ratio.tolist() == [1.0] * 4
    expected = -(advantages[:, None] * mask) / 4  # d(−1/B Σ A_i Σ_t m_t logp_t)/d logp
    assert torch.allclose(logprobs.grad, expected)
    assert loss.item() == pytest.approx(-advantages.mean().item())


def test_clipping_stops_the_gradient_outside_the_trust_region():
    old = torch.zeros(2, 1)
    # ρ = e^0.5 ≈ 1.65 and e^−0.5 ≈ 0.61
    logprobs = torch.tensor([[0.5], [-0.5]], requires_grad=True)
    loss, ratio = rloo_loss(
        logprobs,
        old,
        torch.ones(2, 1),
        torch.tensor([1.0, -1.0]),
        torch.ones(2) / 2,
        epsilon=0.2,
        epsilon_high=0.28,
    )
    loss.backward()
    # A > 0 with ρ > 1 + ε_high, and A < 0 with ρ < 1 − ε: both clipped, no gradient
    assert logprobs.grad.abs().sum().item() == 0.0
    assert loss.item() == pytest.approx(-(1.28 * 1.0 + 0.8 * -1.0) / 2)


def test_masked_rows_get_no_loss():
    logprobs = torch.tensor([[-1.0], [-2.0]], requires_grad=True)
    loss, _ = rloo_loss(
        logprobs,
        logprobs.detach(),
        torch.ones(2, 1),
        torch.tensor([1.0, -1.0]),
        torch.tensor([1.0, 0.0]) / 2,
        epsilon=0.2,
        epsilon_high=0.2,
    )
    loss.backward()
    assert logprobs.grad[1].item() == 0.0
    assert logprobs.grad[0].item() == pytest.approx(-0.5)


def test_loss_gradient_raises_the_probability_of_positive_advantage_completions(
    tiny_model, tiny_tokenizer
):
    """One small SGD step on the RLOO loss moves probability from the worse completion to the better one:
    to first order Δ(log π(y+) − log π(y−)) = lr/B · |∇ log π(y+) − ∇ log π(y−)|² ≥ 0."""
    import copy

    import common
    import rloo

    model = copy.deepcopy(tiny_model)
    prompt = common.prompt_text(
        tiny_tokenizer,
        [{"role": "user", "content": "Compute 3 + 4. Answer in the form <answer>N</answer>."}],
    )
    texts = [prompt + "<answer>7</answer><|im_end|>", prompt + "<answer>9</answer><|im_end|>"]
    enc = tiny_tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    T = len(tiny_tokenizer("<answer>7</answer><|im_end|>", add_special_tokens=False).input_ids)
    mask = torch.ones(2, T)

    def sequence_logprobs():
        return (
            rloo.completion_logprobs(model, enc.input_ids, enc.attention_mask, T, 1.0)[0] * mask
        ).sum(1)

    before = sequence_logprobs().detach()
    logprobs = rloo.completion_logprobs(model, enc.input_ids, enc.attention_mask, T, 1.0)[0]
    advantages = leave_one_out_advantages(torch.tensor([1.0, 0.0]), 2)  # +1, −1
    loss, _ = rloo_loss(
        logprobs,
        logprobs.detach(),
        mask,
        advantages,
        torch.ones(2) / 2,
        epsilon=0.2,
        epsilon_high=0.2,
    )
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=1e-3).step()
    after = sequence_logprobs().detach()
    assert after[0] - after[1] > before[0] - before[1]


def test_the_log_probs_made_in_pieces_equal_the_whole_computation(monkeypatch):
    """log_softmax_and_gather's float32 log-softmax runs in pieces of `chunk` elements; its log-probs,
    their gradient and the entropy −Σ p log p equal those of the whole (B, T, V) log-softmax."""
    import transformers

    import rloo

    shape = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    config = transformers.LlamaConfig(vocab_size=4096, num_key_value_heads=1, **shape)
    model = transformers.LlamaForCausalLM(config)
    B, P, T = 4, 3, 40
    input_ids = torch.randint(0, config.vocab_size, (B, P + T))
    attention_mask = torch.ones_like(input_ids)
    chunk = B * 16 * config.vocab_size  # 16 positions a piece: pieces of 16, 16 and 8
    sizes = []
    log_softmax = torch.log_softmax

    def recorded(x, *args, **kwargs):
        sizes.append(x.numel())
        return log_softmax(x, *args, **kwargs)

    monkeypatch.setattr(torch, "log_softmax", recorded)
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, P - 1 : -1]
    logprobs, entropy = rloo.log_softmax_and_gather(logits, input_ids[:, P:], 0.7, True, chunk)
    weight = model.model.layers[0].mlp.down_proj.weight
    (gradient,) = torch.autograd.grad(logprobs.sum(), weight)
    assert sorted(sizes) == [chunk // 2] * 2 + [chunk] * 4  # each made again in the backward
    monkeypatch.undo()

    logits = model(input_ids=input_ids).logits[:, P - 1 : -1] / 0.7  # t predicts token t
    whole = torch.log_softmax(logits, -1)
    expected = whole.gather(-1, input_ids[:, P:, None])[..., 0]
    torch.testing.assert_close(logprobs, expected)
    torch.testing.assert_close(entropy, -(whole.exp() * whole).sum(-1))
    torch.testing.assert_close(gradient, torch.autograd.grad(expected.sum(), weight)[0])
