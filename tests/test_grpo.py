"""grpo.py: the group-relative advantage, each loss_type's token weights (also split over processes and micro-batches),
the k3 term, clip-higher, the importance-sampling weights and dynamic sampling against hand computations and TRL 1.16;
then end to end: metrics, micro-batch invariance, resume, bad input, and a run that learns."""

import dataclasses
import json
import math

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import common
import grpo
from conftest import ROOT, one_line_error, read_metrics, run_main
from grpo import (
    dynamic_sampling,
    group_relative_advantages,
    grpo_loss,
    importance_sampling_weights,
    loss_normalizer,
    loss_token_weights,
    per_token_kl,
    zero_std_groups,
)
from rewards import compute_rewards
from rloo import leave_one_out_advantages

LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo"]


def args(tmp_path, **overrides) -> grpo.Args:
    """A run of a few seconds: 2 steps of 4 prompts × 4 completions, no evaluation, no checkpoint."""
    small = dict(
        max_steps=2,
        prompts_per_step=4,
        num_generations=4,
        logging_steps=1,
        eval_strategy="no",
        save_steps=0,
    )
    return grpo.Args(**{**small, "output_dir": str(tmp_path / "out"), **overrides})


def whole_batch_weights(mask, loss_type: str, max_completion_length: int) -> torch.Tensor:
    """w of one process that holds the whole batch: its own count is the normalizer."""
    normalizer = loss_normalizer(mask, loss_type, max_completion_length)
    return loss_token_weights(mask, loss_type, normalizer)


def training(output_dir) -> list[dict]:
    return [
        {k: v for k, v in r.items() if k != "step_time"}
        for r in read_metrics(output_dir)
        if "loss" in r
    ]


# ---- the group-relative advantage ----
def test_the_docstrings_worked_example_rewards_10_8_4_2():
    rewards = torch.tensor([10.0, 8.0, 4.0, 2.0])
    centered = group_relative_advantages(rewards, 4, "none")  # group mean 6
    assert centered.tolist() == [4.0, 2.0, -2.0, -4.0]
    rloo = leave_one_out_advantages(rewards, 4)  # RLOO's: G/(G−1) times these
    assert rloo.tolist() == pytest.approx((4 / 3 * centered).tolist())
    std = math.sqrt((16 + 4 + 4 + 16) / 3)  # the sample std of the group, as TRL
    assert group_relative_advantages(rewards, 4, "group").tolist() == pytest.approx(
        [a / (std + 1e-4) for a in (4, 2, -2, -4)]
    )


def test_group_batch_and_no_std_scaling():
    rewards = torch.tensor([10.0, 8.0, 4.0, 2.0, 1.0, 0.0, 1.0, 0.0])
    centered = torch.tensor([4.0, 2.0, -2.0, -4.0, 0.5, -0.5, 0.5, -0.5])
    assert group_relative_advantages(rewards, 4, "none").tolist() == centered.tolist()
    group_std = torch.tensor([math.sqrt(40 / 3)] * 4 + [math.sqrt(1 / 3)] * 4)
    assert torch.allclose(
        group_relative_advantages(rewards, 4, "group"), centered / (group_std + 1e-4)
    )
    # batch: centred in each group, divided by the std of all eight rewards
    assert torch.allclose(
        group_relative_advantages(rewards, 4, "batch"), centered / (rewards.std() + 1e-4)
    )
    for scale in ("group", "batch", "none"):
        assert group_relative_advantages(rewards, 4, scale).view(2, 4).sum(1).abs().max() < 1e-5
        # equal rewards: no signal
        assert group_relative_advantages(torch.ones(4), 4, scale).tolist() == [0.0] * 4


def test_unscorable_completions_stay_out_of_the_mean_and_std_and_get_no_advantage():
    rewards = torch.tensor([3.0, math.nan, 1.0, 2.0, 5.0, math.nan, math.nan, math.nan])
    advantages = group_relative_advantages(rewards, 4, "group")
    # mean 2, std 1 of 3, 1, 2
    assert advantages[:4].tolist() == pytest.approx([1 / 1.0001, 0.0, -1 / 1.0001, 0.0])
    # one scorable completion: no group to compare with
    assert advantages[4:].tolist() == [0.0] * 4


def test_advantages_and_every_loss_type_equal_trls_on_identical_inputs():
    """tests/data/trl_1_16_grpo.json: TRL 1.16's own lines (tests/data/trl_1_16_grpo.py) on fixed inputs, with an
    unscorable completion, clipping (ε_high 0.28) and the KL term without its bias correction (the objectives' file,
    tests/test_trl_equivalence.py, has it)."""
    trl = json.loads((ROOT / "tests" / "data" / "trl_1_16_grpo.json").read_text())
    per_func = [
        [1.0, 0.2],
        [0.0, 0.2],
        [1.0, 0.0],
        [0.0, 0.0],
        [1.0, 0.2],
        [None, None],
        [0.0, 0.2],
        [1.0, 0.2],
    ]
    functions = {
        f"f{j}": lambda completions, j=j, **kw: [row[j] for row in per_func] for j in range(2)
    }
    rewards, _ = compute_rewards(
        functions, torch.tensor([1.0, 0.5]), ["p"] * 8, ["c"] * 8, [[1]] * 8, {}
    )
    for scale in ("group", "batch", "none"):
        advantages = group_relative_advantages(rewards, 4, scale)
        assert advantages.tolist() == pytest.approx(trl[f"advantages/{scale}"], abs=1e-5)
    old, ref, new, mask = (torch.tensor(trl[k]) for k in ("old", "ref", "new", "mask"))
    advantages = torch.tensor(trl["advantages/group"])
    for beta in (0.0, 0.04):
        for loss_type in LOSS_TYPES:
            weights = whole_batch_weights(mask, loss_type, max_completion_length=6)
            loss, _, _ = grpo_loss(
                new,
                old,
                ref,
                advantages,
                weights,
                torch.ones(8, 1),
                beta=beta,
                epsilon=0.2,
                epsilon_high=0.28,
                loss_type=loss_type,
                use_bias_correction_kl=False,
            )
            expected = trl[f"loss/{loss_type}/beta={beta}"]
            assert loss.item() == pytest.approx(expected, abs=1e-6), (loss_type, beta)


# ---- each loss_type's token weights ----
TOY_MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])  # lengths 3 and 1, max_completion_length 4
TOY_ADVANTAGES = torch.tensor([2.0, -1.0])


@pytest.mark.parametrize(
    "loss_type, expected",
    [
        ("grpo", (-2 * 3 / 3 + 1 / 1) / 2),  # the sequences' token means' mean: −0.5
        ("dapo", (-2 * 3 + 1) / 4),  # every token of the batch the same: −1.25
        ("bnpo", (-2 * 3 + 1) / 4),  # as dapo here
        ("dr_grpo", (-2 * 3 + 1) / (2 * 4)),  # B × max_completion_length: −0.625
    ],
)
def test_each_loss_type_on_a_hand_example(loss_type, expected):
    logprobs = torch.tensor(
        [[-1.0, -2.0, -0.5, -9.0], [-0.3, -9.0, -9.0, -9.0]], requires_grad=True
    )
    weights = whole_batch_weights(TOY_MASK, loss_type, max_completion_length=4)
    loss, policy_loss, ratio = grpo_loss(
        logprobs,
        logprobs.detach(),
        None,
        TOY_ADVANTAGES,
        weights,
        1.0,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.2,
    )
    assert loss.item() == pytest.approx(expected)
    assert policy_loss.item() == pytest.approx(expected)
    assert ratio.tolist() == [[1.0] * 4] * 2
    loss.backward()  # on-policy, ∂L/∂logp_{i,t} = −w_{i,t} A_i: the plain policy gradient; padding gets none
    assert torch.allclose(logprobs.grad, -weights * TOY_ADVANTAGES[:, None])
    assert logprobs.grad[TOY_MASK == 0].abs().sum() == 0


def test_the_grpo_normalizer_counts_only_sequences_with_a_loss():
    """With --mask_truncated_completions a masked row leaves grpo's denominator; dr_grpo's constant keeps it."""
    mask = torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 0, 0]])
    assert whole_batch_weights(mask, "grpo", 4).sum(1).tolist() == pytest.approx([0.5, 0.0, 0.5])
    assert whole_batch_weights(mask, "dapo", 4)[0, 0].item() == pytest.approx(1 / 5)
    assert whole_batch_weights(mask, "dr_grpo", 4)[0, 0].item() == pytest.approx(1 / 12)
    # nothing to learn from: no NaN
    assert whole_batch_weights(torch.zeros(2, 3), "dapo", 3).sum().item() == 0.0


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_each_process_gets_its_rows_of_the_whole_batch_weights(loss_type):
    """Each process holds some rows, and the script sums every process's count into the normalizer
    (accelerator.reduce): the shards' weights are the one-process weights of their rows, also when
    the processes hold different numbers of tokens (6 and 7 here; the script multiplies each
    process's weights by N, as DDP averages the N gradients). Each process normalizing by its own
    count, then averaged, would not be the one-process loss (but for dr_grpo's constant)."""
    mask = torch.tensor(
        [[1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]]
    )
    shards = (mask[:3], mask[3:])
    summed = sum(loss_normalizer(shard, loss_type, 4) for shard in shards)
    sharded = [loss_token_weights(shard, loss_type, summed) for shard in shards]
    whole = whole_batch_weights(mask, loss_type, 4)
    assert torch.allclose(torch.cat(sharded), whole)
    own_counts = [whole_batch_weights(shard, loss_type, 4) for shard in shards]
    averaged = torch.cat(own_counts) / len(shards)
    assert torch.allclose(averaged, whole) == (loss_type == "dr_grpo")


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_micro_batches_sum_to_the_whole_batch_loss_and_gradient(loss_type):
    """The normalizer covers the whole batch (after truncation masking), so the micro-batches' losses add up exactly,
    also off-policy (ρ ≠ 1, some tokens clipped), with token-level importance weights and with the KL term."""
    torch.manual_seed(1)
    B, T = 8, 5
    lengths = torch.tensor([5, 1, 3, 4, 2, 5, 3, 1])
    completion_mask = (torch.arange(T)[None] < lengths[:, None]).long()
    is_truncated = lengths == T
    base = -torch.rand(B, T) * 3
    old, ref = base + 0.3 * torch.randn(B, T), base + 0.3 * torch.randn(B, T)
    is_weights = torch.rand(B, T) + 0.5
    advantages = group_relative_advantages(torch.rand(B), 4, "group")
    loss_mask = completion_mask * ~is_truncated[:, None]
    weights = whole_batch_weights(loss_mask, loss_type, max_completion_length=T)

    entropy = torch.rand(B, T) * 2
    entropy_weights = whole_batch_weights(loss_mask, "dapo", max_completion_length=T)

    def loss_and_grad(micro_batch_size, **objective):
        logprobs, total = base.clone().requires_grad_(), 0.0
        for mb in torch.arange(B).split(micro_batch_size):
            loss, _, _ = grpo_loss(
                logprobs[mb],
                old[mb],
                ref[mb],
                advantages[mb],
                weights[mb],
                is_weights[mb],
                loss_mask[mb],
                entropy[mb],
                entropy_weights[mb],
                beta=0.04,
                epsilon=0.2,
                **{"epsilon_high": 0.28, **objective},
            )
            loss.backward()
            total += loss.item()
        return total, logprobs.grad

    # GSPO's ratio, δ and the entropy bonus; CISPO (its own weights aside)
    gspo = dict(importance_sampling_level="sequence", delta=1.3, entropy_coef=0.1)
    for objective in ({}, gspo, dict(loss_type="cispo", epsilon_high=1.1)):
        whole_loss, whole_grad = loss_and_grad(B, **objective)
        for micro in (1, 2, 4):
            loss, grad = loss_and_grad(micro, **objective)
            assert loss == pytest.approx(whole_loss, rel=1e-5, abs=1e-7)
            assert torch.allclose(grad, whole_grad, atol=1e-7)
        assert whole_grad[is_truncated].abs().sum() == 0
        assert whole_grad[~is_truncated].abs().sum() > 0


# ---- the KL term ----
def test_k3_values_and_gradient():
    logprobs = torch.tensor([math.log(0.5), -1.3], requires_grad=True)
    kl = per_token_kl(logprobs, torch.tensor([math.log(0.25), -1.3]))
    # exp(ref − logp) − (ref − logp) − 1; 0 if equal
    assert kl.tolist() == pytest.approx([0.5 + math.log(2) - 1, 0.0])
    kl.sum().backward()
    assert logprobs.grad.tolist() == pytest.approx([1 - 0.5, 0.0])  # ∂k3/∂logp = 1 − π_ref/π_θ
    assert (per_token_kl(torch.randn(100), torch.randn(100)) >= 0).all()


@pytest.mark.parametrize("bias_correction, gradient", [(False, 1 - 0.5), (True, math.log(2))])
def test_the_kl_term_weighs_beta_and_is_not_importance_weighted(bias_correction, gradient):
    """π_θ = 0.5, π_ref = 0.25, on-policy (ρ = 1): k3's value either way; its gradient 1 − π_ref/π_θ = 0.5 alone, and
    with TRL 1.16's bias correction ∇(ρ · k3) = k3 + 1 − π_ref/π_θ = log(π_θ/π_ref) = log 2, the KL's own gradient."""
    logprobs = torch.tensor([[math.log(0.5), 0.0]], requires_grad=True)
    ref_logprobs = torch.tensor([[math.log(0.25), 0.0]])
    weights = whole_batch_weights(torch.tensor([[1, 0]]), "dapo", 2)
    loss, policy_loss, _ = grpo_loss(
        logprobs,
        logprobs.detach(),
        ref_logprobs,
        torch.tensor([0.0]),
        weights,
        torch.tensor([[3.0]]),
        beta=0.04,
        epsilon=0.2,
        epsilon_high=0.2,
        use_bias_correction_kl=bias_correction,
    )
    assert loss.item() == pytest.approx(0.04 * (0.5 + math.log(2) - 1)) == policy_loss.item()
    loss.backward()
    assert logprobs.grad[0].tolist() == pytest.approx([0.04 * gradient, 0.0])


# ---- clipping and importance sampling ----
def test_clip_higher_lets_positive_advantage_tokens_grow_further():
    """ρ = 1.25 with A > 0: clipped (no gradient) at ε_high = ε = 0.2, free at DAPO's ε_high = 0.28."""
    old = torch.zeros(1, 1)
    for epsilon_high, expected_loss, expected_grad in ((0.2, -1.2, 0.0), (0.28, -1.25, -1.25)):
        logprobs = torch.tensor([[math.log(1.25)]], requires_grad=True)
        loss, _, _ = grpo_loss(
            logprobs,
            old,
            old,
            torch.tensor([1.0]),
            torch.ones(1, 1),
            1.0,
            beta=0.0,
            epsilon=0.2,
            epsilon_high=epsilon_high,
        )
        loss.backward()
        assert loss.item() == pytest.approx(expected_loss)
        assert logprobs.grad.item() == pytest.approx(expected_grad)


def test_the_lower_clip_holds_and_negative_advantages_are_never_clipped_above():
    old = torch.zeros(2, 1)
    for epsilon_high in (0.2, 0.28):
        logprobs = torch.tensor([[math.log(0.75)], [math.log(1.25)]], requires_grad=True)
        loss, _, _ = grpo_loss(
            logprobs,
            old,
            old,
            torch.tensor([-1.0, -1.0]),
            torch.ones(2, 1),
            1.0,
            beta=0.0,
            epsilon=0.2,
            epsilon_high=epsilon_high,
        )
        loss.backward()
        # ρ = 0.75 < 1 − ε with A < 0: clipped at 0.8, no gradient; ρ = 1.25 with A < 0: the unclipped (worse) term
        assert logprobs.grad[:, 0].tolist() == pytest.approx([0.0, 1.25])
        assert loss.item() == pytest.approx(0.8 + 1.25)


def test_importance_sampling_weights_by_hand():
    """π_θ_old / π_vllm per completion (the product over its tokens) or per token; capped at C or zeroed above it."""
    old = torch.log(torch.tensor([[0.5, 0.4, 0.9], [0.2, 0.3, 0.3]]))
    sampler = torch.log(torch.tensor([[0.25, 0.8, 0.1], [0.4, 0.3, 0.9]]))
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])  # the first completion's third token: padding

    def weights(mode):
        is_weights = importance_sampling_weights(old, sampler, mask, mode=mode, clip_max=1.5)
        return is_weights.flatten().tolist()

    # 2 · 0.5; 0.5 · 1 · (1/3)
    assert weights("sequence_truncate") == pytest.approx([1.0, 0.5 / 3])
    assert weights("sequence_mask") == pytest.approx([1.0, 0.5 / 3])
    # 2 capped at 1.5
    assert weights("token_truncate") == pytest.approx([1.5, 0.5, 1.0, 0.5, 1.0, 1 / 3])
    assert weights("token_mask") == pytest.approx([0.0, 0.5, 1.0, 0.5, 1.0, 1 / 3])  # 2 zeroed


# ---- GSPO, CISPO, δ and the entropy bonus ----
def test_gspo_clips_the_completions_mean_ratio_as_one_and_reaches_every_token():
    """Token ratios 2 and 1/2 (and padding, which counts for nothing) give s = exp((log 2 − log 2) / 2) = 1: nothing
    clipped, where the token level clips ρ = 2 > 1 + ε for A = 1. The gradient reaches each token as
    −A · s · w · |y| / |y| = −0.5 with grpo's weights 1/2; the token level's: 0 (clipped) and −ρ w A = −0.25."""
    mask = torch.tensor([[1, 1, 0]])
    weights = whole_batch_weights(mask, "grpo", 3)
    expected = {
        "token": (-(1.2 + 0.5) / 2, [0.0, -0.25, 0.0]),
        "sequence": (-1.0, [-0.5, -0.5, 0.0]),
    }
    for level, (expected_loss, expected_grad) in expected.items():
        logprobs = torch.tensor([[math.log(2), math.log(0.5), 5.0]], requires_grad=True)
        loss, _, ratio = grpo_loss(
            logprobs,
            torch.zeros(1, 3),
            None,
            torch.tensor([1.0]),
            weights,
            1.0,
            mask,
            beta=0.0,
            epsilon=0.2,
            epsilon_high=0.2,
            loss_type="grpo",
            importance_sampling_level=level,
        )
        loss.backward()
        assert loss.item() == pytest.approx(expected_loss)
        assert logprobs.grad[0].tolist() == pytest.approx(expected_grad)
    assert ratio.shape == (1, 1)  # one s per completion
    assert ratio.item() == pytest.approx(1.0)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_gspo_on_policy_has_the_token_levels_gradient(loss_type):
    """One update per batch: s_i ≡ 1, and as w is the same on all of y_i's tokens, ∇L is the token level's."""
    mask = (torch.arange(5)[None] < torch.tensor([5, 2, 4, 1])[:, None]).long()
    base = -torch.rand(4, 5, generator=torch.Generator().manual_seed(0))
    weights = whole_batch_weights(mask, loss_type, 5)
    grads = []
    for level in ("token", "sequence"):
        logprobs = base.clone().requires_grad_()
        loss, _, _ = grpo_loss(
            logprobs,
            base,
            None,
            torch.tensor([1.0, -0.5, 0.3, -0.8]),
            weights,
            1.0,
            mask,
            beta=0.0,
            epsilon=0.2,
            epsilon_high=0.2,
            importance_sampling_level=level,
        )
        loss.backward()
        grads.append(logprobs.grad)
    assert torch.allclose(grads[0], grads[1], atol=1e-7)


def test_cispo_keeps_every_tokens_gradient_weighted_by_its_capped_ratio():
    """ℓ = −sg(min(ρ, ε_high)) A log π. ρ = 1.5 > ε_high = 1.2 with A = 1: the gradient −1.2, where the clipped
    surrogate gives none; ρ = 0.5 with A = −1: +0.5, where the lower clip (0.8) gives none."""
    logprobs = torch.tensor([[math.log(1.5)], [math.log(0.5)]], requires_grad=True)
    loss, _, _ = grpo_loss(
        logprobs,
        torch.zeros(2, 1),
        None,
        torch.tensor([1.0, -1.0]),
        torch.ones(2, 1),
        1.0,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=1.2,
        loss_type="cispo",
    )
    loss.backward()
    assert loss.item() == pytest.approx(-1.2 * math.log(1.5) + 0.5 * math.log(0.5))
    assert logprobs.grad[:, 0].tolist() == pytest.approx([-1.2, 0.5])


def test_delta_caps_the_unclipped_ratio_of_a_negative_advantage():
    """A = −1, ρ = 3: min(ρ A, clip(ρ) A) = −3 grows without bound in ρ (loss 3, gradient 3); δ = 2 caps it (loss 2, no
    gradient)."""
    for delta, expected in ((None, 3.0), (2.0, 2.0)):
        logprobs = torch.tensor([[math.log(3.0)]], requires_grad=True)
        loss, _, _ = grpo_loss(
            logprobs,
            torch.zeros(1, 1),
            None,
            torch.tensor([-1.0]),
            torch.ones(1, 1),
            1.0,
            beta=0.0,
            epsilon=0.2,
            epsilon_high=0.28,
            delta=delta,
        )
        loss.backward()
        assert loss.item() == pytest.approx(expected)
        assert logprobs.grad.item() == pytest.approx(3.0 if delta is None else 0.0)


def test_the_entropy_bonus_is_c_times_the_mean_entropy_of_the_loss_tokens():
    """H = 1, 2 and 0.5 on the three tokens (padding's 9 left out), c = 0.1: L = policy_loss − 0.1 · 3.5 / 3, whatever
    the loss_type's weights (dr_grpo here), and ∂L/∂H_t = −c / 3 on each token."""
    mask = torch.tensor([[1, 1], [1, 0]])
    entropy = torch.tensor([[1.0, 2.0], [0.5, 9.0]], requires_grad=True)
    loss, policy_loss, _ = grpo_loss(
        torch.zeros(2, 2),
        torch.zeros(2, 2),
        None,
        torch.tensor([1.0, -1.0]),
        whole_batch_weights(mask, "dr_grpo", 2),
        1.0,
        mask,
        entropy,
        whole_batch_weights(mask, "dapo", 2),
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.2,
        entropy_coef=0.1,
    )
    loss.backward()
    assert policy_loss.item() == pytest.approx(-(2 * 1 - 1) / 4)  # −Σ w A, w = 1 / (B · 2)
    assert policy_loss.item() - loss.item() == pytest.approx(0.1 * 3.5 / 3)
    assert entropy.grad.flatten().tolist() == pytest.approx([-0.1 / 3] * 3 + [0.0])


@pytest.mark.parametrize("loss_type, warned", [("grpo", False), ("dapo", True), ("cispo", True)])
def test_sequence_level_with_a_length_weighted_loss_warns_in_one_line(capsys, loss_type, warned):
    """As TRL: GSPO's objective is loss_type grpo's; the others weigh each s_i by its completion's length."""
    grpo.check_args(grpo.Args(importance_sampling_level="sequence", loss_type=loss_type))
    stderr = capsys.readouterr().err
    assert len(stderr.splitlines()) == warned
    assert ("warning: --loss_type" in stderr) == warned


@pytest.mark.parametrize(
    "flags, clip_key",
    [
        (dict(importance_sampling_level="sequence", loss_type="grpo"), "clip_ratio/region_mean"),
        (dict(loss_type="cispo", epsilon_high=5.0), "cispo_clip_ratio"),
    ],
)
def test_gspo_and_cispo_runs_log_trls_clip_metrics(tmp_path, flags, clip_key):
    """Two updates per batch. GSPO's clip_ratio/* count completions (of the 16 in each of 2 passes: multiples of 1/32),
    as TRL's; CISPO logs cispo_clip_ratio alone."""
    grpo.main(args(tmp_path, num_iterations=2, learning_rate=3e-3, **flags))
    train = training(tmp_path / "out")
    assert all(0 <= r[clip_key] <= 1 for r in train)
    assert all(("clip_ratio/low_mean" in r) == (clip_key != "cispo_clip_ratio") for r in train)
    if clip_key == "clip_ratio/region_mean":
        assert all(r[clip_key] * 32 == pytest.approx(round(r[clip_key] * 32)) for r in train)


# ---- dynamic sampling ----
def fake_round(
    rewards: list[float], prompt_width: int, completion_width: int, tag: str, G: int = 2
) -> dict:
    """A round of sampling, as grpo.py's loop keeps it: prompts left-padded, completions right-padded."""
    B = len(rewards)
    prompt_mask = torch.ones(B, prompt_width, dtype=torch.long)
    prompt_mask[:, 0] = 0
    completion_mask = torch.ones(B, completion_width)
    completion_mask[:, -1] = 0
    return {
        "prompt_ids": torch.where(prompt_mask.bool(), 7, 0),
        "prompt_mask": prompt_mask,
        "completion_ids": torch.where(completion_mask.bool(), 5, 0),
        "completion_mask": completion_mask,
        "is_truncated": torch.zeros(B, dtype=torch.bool),
        "texts": [f"{tag}{i // G}" for i in range(B)],
        "rewards": torch.tensor(rewards, dtype=torch.float),
    }


def test_dynamic_sampling_drops_groups_whose_rewards_are_all_equal_and_samples_more():
    rounds = [
        # groups a1, a3 differ
        fake_round([1, 1, 0, 1, 0, 0, 1, 0], prompt_width=3, completion_width=2, tag="a"),
        # groups b0, b2 differ
        fake_round([1, 0, 1, 1, 0, 1, 0, 0], prompt_width=5, completion_width=4, tag="b"),
    ]
    # grpo.py samples rounds until 4 groups' rewards differ (A ≠ 0): these two, and no third
    differing = [(~zero_std_groups(r["rewards"], 2)).sum().item() for r in rounds]
    assert differing == [2, 2]
    batch, dropped_frac = dynamic_sampling(
        rounds, num_prompts=4, num_generations=2, pad_token_id=0
    )
    assert batch["texts"] == ["a1", "a1", "a3", "a3", "b0", "b0", "b2", "b2"]
    assert batch["rewards"].tolist() == [0, 1, 1, 0, 1, 0, 0, 1]
    assert dropped_frac == 4 / 8
    # rounds of different widths: the prompts stay left-padded, the completions right-padded
    assert batch["prompt_mask"].shape == (8, 5)
    assert batch["completion_mask"].shape == (8, 4)
    assert batch["prompt_mask"][0].tolist() == [0, 0, 0, 1, 1]
    assert batch["prompt_ids"][0].tolist() == [0, 0, 0, 7, 7]
    assert batch["completion_mask"][0].tolist() == [1, 0, 0, 0]
    assert batch["completion_mask"][4].tolist() == [1, 1, 1, 0]


def test_dynamic_sampling_fills_up_with_equal_reward_groups_when_the_rounds_run_out():
    only = fake_round([1, 1, 0, 1, 0, 0, 1, 1], prompt_width=3, completion_width=2, tag="a")
    batch, dropped_frac = dynamic_sampling(
        [only], num_prompts=4, num_generations=2, pad_token_id=0
    )
    assert batch["texts"] == only["texts"]
    assert dropped_frac == 3 / 4


@pytest.mark.parametrize("rewards, rounds", [("constant", 4), ("alternating", 1)])
def test_dynamic_sampling_samples_rounds_until_enough_groups_differ(
    tmp_path, monkeypatch, rewards, rounds
):
    """All groups equal: 1 round and all --max_resample_rounds 3; every group differs: 1 round."""
    (tmp_path / "r.py").write_text(
        "def constant(completions, **kwargs):\n    return [1.0] * len(completions)\n"
        "def alternating(completions, **kwargs):\n"
        "    return [float(i % 2) for i in range(len(completions))]\n"
    )
    calls = []
    generate = common.generate

    def counting_generate(*args, **kwargs):
        calls.append(1)
        return generate(*args, **kwargs)

    monkeypatch.setattr(common, "generate", counting_generate)
    reward_funcs = [f"{tmp_path / 'r.py'}:{rewards}"]
    run = args(tmp_path, max_steps=1, dynamic_sampling=True, max_resample_rounds=3)
    grpo.main(dataclasses.replace(run, reward_funcs=reward_funcs))
    assert len(calls) == rounds


# ---- end to end ----
def test_a_run_logs_trls_metrics_with_the_kl_term_and_dynamic_sampling(tmp_path):
    rewards = dict(reward_funcs=["accuracy", "format"], reward_weights=["1", "0.2"])
    flags = dict(beta=0.04, entropy_coef=0.01, dynamic_sampling=True, max_resample_rounds=2)
    grpo.main(args(tmp_path, **flags, **rewards))
    train = training(tmp_path / "out")
    assert [r["step"] for r in train] == [1, 2]
    for key in (
        "reward",
        "reward_std",
        "frac_reward_zero_std",
        "rewards/accuracy_reward/mean",
        "rewards/format_reward/mean",
        "completions/mean_length",
        "completions/clipped_ratio",
        "kl",
        "entropy",
        "loss",
        "policy_loss",
        "grad_norm",
        "clip_ratio/low_mean",
        "clip_ratio/low_min",
        "clip_ratio/high_mean",
        "clip_ratio/high_max",
        "clip_ratio/region_mean",
        "dynamic_sampling/dropped_frac",
        "learning_rate",
        "num_tokens",
    ):
        assert all(key in r for r in train), key
    # π_θ = π_ref until the first update
    assert train[0]["kl"] == pytest.approx(0.0, abs=1e-6)
    assert train[1]["kl"] > 0
    for r in train:  # the entropy bonus: loss = policy_loss − c · H̄, H̄ the logged entropy
        assert r["policy_loss"] - r["loss"] == pytest.approx(0.01 * r["entropy"], rel=1e-4)
    # up to 3 rounds of 4 prompts: a batch holds a group of equal rewards only if fewer than 4 of 12 groups differed
    assert any(r["dynamic_sampling/dropped_frac"] > 0 for r in train)
    assert all(
        r["frac_reward_zero_std"] == 0.0 or r["dynamic_sampling/dropped_frac"] > 8 / 12
        for r in train
    )


def test_beta_zero_loads_no_reference_model_and_logs_no_kl(tmp_path, monkeypatch):
    loads = []
    load = AutoModelForCausalLM.from_pretrained

    def counting_load(*positional, **keywords):
        loads.append(positional)
        return load(*positional, **keywords)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", counting_load)
    grpo.main(args(tmp_path, max_steps=1))
    assert len(loads) == 1
    assert "kl" not in training(tmp_path / "out")[0]


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_micro_batching_does_not_change_the_updates(tmp_path, recorded_gradients, loss_type):
    """With truncation masking (max_completion_length 7 truncates some completions), the k3 term and two updates per
    batch (the second off-policy, π_θ ≠ π_ref): the same gradients whether the batch is one piece or micro-batches that
    split groups (6 completions = 1.5 groups)."""
    setup = dict(
        prompts_per_step=3,
        max_completion_length=7,
        mask_truncated_completions=True,
        loss_type=loss_type,
    )
    whole = args(tmp_path, max_steps=1, beta=0.1, num_iterations=2, scale_rewards="batch", **setup)
    grpo.main(whole)
    grpo.main(dataclasses.replace(whole, micro_batch_size=6, output_dir=str(tmp_path / "micro")))
    assert len(recorded_gradients) == 4
    for one_batch, micro_batches in zip(recorded_gradients[:2], recorded_gradients[2:]):
        assert one_batch.abs().max() > 0
        assert torch.allclose(one_batch, micro_batches, rtol=1e-4, atol=1e-7)
    (a,), (b,) = training(tmp_path / "out"), training(tmp_path / "micro")
    assert 0 < a["completions/clipped_ratio"] < 1  # some completions are masked, some are not
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-7)


def test_resume_with_dynamic_sampling_gives_the_uninterrupted_run(tmp_path):
    """The extra rounds' prompts are drawn from (seed, step, round): a resumed run draws the same."""
    full = args(
        tmp_path, max_steps=4, save_steps=2, beta=0.1, num_iterations=2, dynamic_sampling=True
    )
    grpo.main(full)
    checkpoint = str(tmp_path / "out" / "checkpoint-2")
    grpo.main(
        dataclasses.replace(
            full, output_dir=str(tmp_path / "resumed"), resume_from_checkpoint=checkpoint
        )
    )
    assert training(tmp_path / "resumed") == training(tmp_path / "out")[2:]
    final, again = (load_file(tmp_path / run / "model.safetensors") for run in ("out", "resumed"))
    assert all(torch.equal(final[k], again[k]) for k in final)


def test_a_sampler_that_is_not_the_policy_gets_importance_weights(
    tmp_path, monkeypatch, recorded_gradients
):
    """As when vLLM samples: the sampler's log-probs (here the policy's, shifted by a known amount per token) give TRL's
    sampling/* metrics and weights on the loss, per token, through dynamic sampling's rounds; micro-batches still sum
    to the one-batch gradient."""
    generate = common.generate

    def off_policy_generate(model, tokenizer, texts, config):
        out = generate(model, tokenizer, texts, config, sampler_logprobs=True)
        # π_θ_old / π_sampler = e^0.1 per token
        return out | {"sampler_logprobs": out["sampler_logprobs"] - 0.1}

    monkeypatch.setattr(common, "generate", off_policy_generate)
    mode = dict(
        vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=3.0
    )
    whole = args(tmp_path, max_steps=1, dynamic_sampling=True, **mode)
    grpo.main(whole)
    (record,) = training(tmp_path / "out")
    assert record["sampling/importance_sampling_ratio/mean"] == pytest.approx(
        math.exp(0.1), rel=1e-4
    )
    assert record["sampling/sampling_logp_difference/max"] == pytest.approx(0.1, rel=1e-4)
    grpo.main(dataclasses.replace(whole, micro_batch_size=4, output_dir=str(tmp_path / "micro")))
    one_batch, micro_batches = recorded_gradients
    assert one_batch.abs().max() > 0
    assert torch.allclose(one_batch, micro_batches, rtol=1e-4, atol=1e-7)


def test_bf16_samples_from_the_policy_itself_with_no_correction(tmp_path):
    grpo.main(args(tmp_path, max_steps=1, bf16=True))
    (record,) = training(tmp_path / "out")
    assert record["grad_norm"] > 0
    assert not any(key.startswith("sampling/") for key in record)


@pytest.mark.parametrize(
    "flags, line",
    [
        (["--num_generations", "1"], "--num_generations: the baseline needs G ≥ 2, got 1"),
        (["--scale_rewards", "std"], "--scale_rewards/--scale-rewards: invalid choice: 'std'"),
        (["--loss_type", "sequence"], "--loss_type/--loss-type: invalid choice: 'sequence'"),
        (["--beta", "-0.1"], "--beta: must be ≥ 0, got -0.1"),
        (["--epsilon_high", "0"], "--epsilon_high: must be positive"),
        (["--max_resample_rounds", "-1"], "--max_resample_rounds: must be ≥ 0, got -1"),
        (["--vllm_importance_sampling_mode", "token"], "invalid choice: 'token'"),
        (
            ["--prompts_per_step", "3", "--micro_batch_size", "5"],
            "--micro_batch_size: must divide 24 completions",
        ),
    ],
)
def test_bad_flags_are_one_line_with_exit_status_2_and_nothing_written(
    tmp_path, flags, line, capsys
):
    out = tmp_path / "out"
    assert line in one_line_error(
        grpo, *flags, "--eval_strategy", "no", "--output_dir", out, capsys=capsys
    )
    assert not out.exists() or not list(out.iterdir())


@pytest.mark.slow
def test_the_quick_start_learns(tmp_path):
    """`python grpo.py`, as the docstring says, shortened: held-out accuracy rises, sampled and greedy."""
    run_main(grpo, "--max_steps", "40", "--output_dir", tmp_path / "out")
    evals = [r for r in read_metrics(tmp_path / "out") if "eval/accuracy" in r]
    first, last = evals[0], evals[-1]
    assert last["eval/accuracy"] - first["eval/accuracy"] >= 0.15
    assert last["eval/accuracy_greedy"] >= first["eval/accuracy_greedy"]
