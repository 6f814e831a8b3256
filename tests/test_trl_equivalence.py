"""The estimators give TRL 1.16's numbers on identical inputs: tests/data/trl_1_16_*.json holds the inputs and what
TRL's own lines made of them (tests/data/trl_1_16_*.py, run with trl 1.16)."""

import json
import math

import pytest
import torch

import grpo
import rloo
from conftest import ROOT
from rewards import compute_rewards

RLOO = json.loads((ROOT / "tests" / "data" / "trl_1_16_rloo.json").read_text())
OBJECTIVES = json.loads((ROOT / "tests" / "data" / "trl_1_16_grpo_objectives.json").read_text())
PER_FUNC = [
    [1.0, 0.2],
    [0.0, 0.2],
    [1.0, 0.0],
    [0.0, 0.0],
    [1.0, 0.2],
    [None, None],
    [0.0, 0.2],
    [1.0, 0.2],
]


@pytest.mark.parametrize("beta, normalize", [(0.0, False), (0.1, False), (0.1, True)])
def test_rloo_advantages_and_loss_equal_trls(beta, normalize):
    functions = {
        f"f{j}": lambda completions, j=j, **kw: [row[j] for row in PER_FUNC] for j in range(2)
    }
    rewards, _ = compute_rewards(
        functions, torch.tensor([1.0, 0.5]), ["p"] * 8, ["c"] * 8, [[1]] * 8, {}
    )
    old, ref, new, mask = (torch.tensor(RLOO[k]) for k in ("old", "ref", "new", "mask"))
    kl = rloo.per_token_kl(old, ref, "k1") * mask
    advantages = rloo.leave_one_out_advantages(rewards - beta * kl.sum(1), 4)
    if normalize:  # as rloo.py: the advantages' mean is already 0
        advantages = advantages / (advantages[~advantages.isnan()].std() + 1e-4)
    advantages = advantages.nan_to_num(0.0)
    trl = RLOO[f"beta={beta},normalize={normalize}"]
    assert advantages.tolist() == pytest.approx(trl["advantages"], abs=1e-5)
    loss, _ = rloo.rloo_loss(
        new, old, mask, advantages, torch.ones(8) / 8, epsilon=0.2, epsilon_high=0.28
    )
    assert loss.item() == pytest.approx(trl["loss"], abs=1e-6)
    assert not math.isnan(loss.item())


@pytest.mark.parametrize("name", [k for k, v in OBJECTIVES.items() if isinstance(v, dict)])
def test_grpo_objectives_equal_trls_over_two_updates_of_a_batch(name):
    """GSPO (with grpo and dapo), CISPO, delta, the entropy bonus and the KL with and without its bias correction: the
    loss and its gradient in θ, at the on-policy first update and at the second (ρ ≠ 1, some clipped), within 1e-5 of
    TRL 1.16's own _compute_loss (tests/data/trl_1_16_grpo_objectives.py) on the same logits θ (B, T, V)."""
    record = OBJECTIVES[name]
    flags = dict(beta=0.0, epsilon_high=0.2) | record["config"]
    tokens, ref, mask, advantages, move = (
        torch.tensor(OBJECTIVES[k]) for k in ("tokens", "ref", "mask", "advantages", "move")
    )
    normalizer = grpo.loss_normalizer(
        mask, flags["loss_type"], OBJECTIVES["max_completion_length"]
    )
    weights = grpo.loss_token_weights(mask, flags["loss_type"], normalizer)
    entropy_weights = grpo.loss_token_weights(mask, "dapo", mask.sum())  # the mean over the tokens
    theta = torch.tensor(OBJECTIVES["logits"], requires_grad=True)
    old = None
    for iteration in range(2):
        logp = torch.log_softmax(theta, -1)
        logprobs = logp.gather(-1, tokens[..., None])[..., 0]
        entropy = -(logp.exp() * logp).sum(-1)
        if old is None:  # π_θ_old: the policy that sampled, before the first update
            old = logprobs.detach()
        loss, _, _ = grpo.grpo_loss(
            logprobs,
            old,
            ref,
            advantages,
            weights,
            torch.ones(8, 1),
            mask,
            entropy,
            entropy_weights,
            epsilon=0.2,
            **flags,
        )
        loss.backward()
        assert loss.item() == pytest.approx(record["losses"][iteration], rel=1e-5, abs=1e-7)
        trl_grad = torch.tensor(record["grads"][iteration])
        assert (theta.grad - trl_grad).norm() <= 1e-5 * trl_grad.norm(), iteration
        with torch.no_grad():  # an SGD step, then the generator's fixed move
            theta += move - OBJECTIVES["lr"] * theta.grad
        theta.grad = None
