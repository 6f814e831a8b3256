"""reinforce.py: the moving-average baseline, REINFORCE++ whitening, the no-baseline gradient and the KL-shaped reward
against hand computations; then end to end: bad inputs, the running mean across steps and across a resume,
micro-batch invariance, and a run that learns."""

import dataclasses
import math

import pytest
import torch
from safetensors.torch import load_file

import common
import reinforce
from common import ConfigError
from reinforce import per_token_kl, reinforce_advantages, reinforce_loss

FAST = dict(prompts_per_step=8, max_steps=2, eval_steps=0, logging_steps=1, save_steps=0, num_generations_eval=1)


def args(tmp_path, **overrides) -> reinforce.Args:
    return reinforce.Args(**{"output_dir": str(tmp_path / "out"), **FAST, **overrides})


def training_records(output_dir):
    return [{k: v for k, v in r.items() if k != "step_time"} for r in common.read_metrics(output_dir) if "reward" in r]


def training_state(checkpoint):
    return torch.load(checkpoint / "training_state.pt", weights_only=False)


# ---- baselines ----
def test_moving_average_baseline_over_several_steps_by_hand():
    """b for a batch is the mean of every reward of the steps before it (Eq. 8), 0 before the first step."""
    batches = [
        torch.tensor([1.0, 0.0, 1.0, 1.0]),
        torch.tensor([0.0, 0.0, 1.0, 0.0]),
        torch.tensor([1.0, 1.0, 1.0, 1.0]),
    ]
    expected = [[1.0, 0.0, 1.0, 1.0], [-0.75, -0.75, 0.25, -0.75], [0.5, 0.5, 0.5, 0.5]]  # b = 0, 3/4, 4/8
    reward_sum, reward_count = 0.0, 0
    for rewards, advantages in zip(batches, expected):
        assert reinforce_advantages(
            rewards, baseline="moving_average", reward_sum=reward_sum, reward_count=reward_count
        ).tolist() == pytest.approx(advantages)
        reward_sum, reward_count = reward_sum + rewards.sum().item(), reward_count + len(rewards)
    # a running mean of everything seen, not an exponential moving average: step 4's b = 8/12
    assert reinforce_advantages(
        torch.tensor([1.0]), baseline="moving_average", reward_sum=reward_sum, reward_count=reward_count
    ).item() == pytest.approx(1 - 8 / 12)


def test_reinforce_pp_whitens_over_the_batch():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])  # mean 0.75, unbiased std 0.5
    advantages = reinforce_advantages(
        rewards, baseline="reinforce_pp", reward_sum=123.0, reward_count=7
    )  # the running mean plays no part
    assert advantages.tolist() == pytest.approx([0.25 / 0.5001, -0.75 / 0.5001, 0.25 / 0.5001, 0.25 / 0.5001])
    assert advantages.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert (
        reinforce_advantages(torch.ones(4), baseline="reinforce_pp", reward_sum=0.0, reward_count=0).tolist()
        == [0.0] * 4
    )


def test_reinforce_pp_on_one_process_of_several_whitens_with_the_whole_batch():
    """Under accelerate a process holds some of the batch's R; whitened with every process's R (gathered), its
    advantages are its rows of the one-process advantages."""
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.5])
    whole = reinforce_advantages(rewards, baseline="reinforce_pp", reward_sum=0.0, reward_count=0)
    assert reinforce_advantages(
        rewards[:2], baseline="reinforce_pp", reward_sum=0.0, reward_count=0, batch_rewards=rewards
    ).tolist() == pytest.approx(whole[:2].tolist())
    assert reinforce_advantages(
        rewards[:2], baseline="reinforce_pp", reward_sum=0.0, reward_count=0
    ).tolist() == pytest.approx([0.5 / (0.5**0.5 + 1e-4), -0.5 / (0.5**0.5 + 1e-4)])  # its own R only: std 1/√2


def test_no_baseline_is_the_reward_and_its_gradient_is_reinforce():
    """∇L = −1/B Σ_i R_i ∇ Σ_t log π(y_i,t) (Eq. 6), padding excluded."""
    rewards = torch.tensor([1.0, 0.0, 0.5])
    advantages = reinforce_advantages(rewards, baseline="none", reward_sum=10.0, reward_count=4)
    assert advantages.tolist() == rewards.tolist()
    logprobs = torch.tensor([[-1.0, -2.0], [-0.5, -0.1], [-3.0, -0.2]], requires_grad=True)
    mask = torch.tensor([[1, 1], [1, 0], [1, 1]])
    loss, ratio = reinforce_loss(
        logprobs, logprobs.detach(), mask, advantages, torch.ones(3) / 3, epsilon=0.2, epsilon_high=0.2
    )
    loss.backward()
    assert ratio.tolist() == [1.0] * 3
    assert torch.allclose(logprobs.grad, -(rewards[:, None] * mask) / 3)
    assert loss.item() == pytest.approx(-rewards.mean().item())


def test_sequence_ratio_is_clipped():
    old = torch.zeros(2, 1)
    logprobs = torch.tensor([[0.5], [-0.5]], requires_grad=True)  # ρ = e^0.5 ≈ 1.65 and e^−0.5 ≈ 0.61
    loss, _ = reinforce_loss(
        logprobs,
        old,
        torch.ones(2, 1),
        torch.tensor([1.0, -1.0]),
        torch.ones(2) / 2,
        epsilon=0.2,
        epsilon_high=0.28,
    )
    loss.backward()
    assert logprobs.grad.abs().sum().item() == 0.0
    assert loss.item() == pytest.approx(-(1.28 * 1.0 + 0.8 * -1.0) / 2)


def test_kl_estimators_and_the_kl_shaped_reward():
    logprobs = torch.tensor([[math.log(0.5), math.log(0.5)]])
    ref_logprobs = torch.tensor([[math.log(0.25), math.log(0.5)]])
    k1 = per_token_kl(logprobs, ref_logprobs, "k1")
    k3 = per_token_kl(logprobs, ref_logprobs, "k3")
    assert k1.tolist()[0] == pytest.approx([math.log(2), 0.0])
    assert k3.tolist()[0] == pytest.approx([0.5 + math.log(2) - 1, 0.0])
    # the KL-shaped reward R = r − β Σ_t kl_t, then the baseline
    shaped = torch.tensor([1.0]) - 0.1 * k1.sum(1)
    assert reinforce_advantages(
        shaped, baseline="moving_average", reward_sum=1.0, reward_count=4
    ).item() == pytest.approx(1 - 0.1 * math.log(2) - 0.25)


# ---- end to end ----
@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(num_generations=0), "--num_generations: must be ≥ 1"),
        (dict(baseline="ema"), "--baseline: expected one of none, moving_average, reinforce_pp"),
        (
            dict(baseline="reinforce_pp", prompts_per_step=1),
            "--baseline: reinforce_pp whitens over the batch and needs at least 2",
        ),
        (dict(prompts_per_step=6, micro_batch_size=4), "--micro_batch_size: 4 does not divide the batch of 6"),
        (dict(kl_estimator="k2"), "--kl_estimator: must be k1 or k3"),
        (dict(learning_rate=0.0), "--learning_rate: must be positive"),
        (dict(lr_scheduler_type="cosine_with_bumps"), "--lr_scheduler_type: unknown scheduler 'cosine_with_bumps'"),
        (dict(reward_clip_range=[1.0]), "--reward_clip_range: expected two numbers"),
        (dict(model_name_or_path="/no/such/model"), "--model_name_or_path: cannot load a tokenizer"),
        (dict(dataset_name="/no/such/data.jsonl"), "--dataset_name: no such file"),
        (dict(resume_from_checkpoint="latest"), "--resume_from_checkpoint latest: no checkpoint"),
    ],
)
def test_bad_input_is_a_config_error_naming_the_flag(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        reinforce.main(args(tmp_path, **overrides))
    assert not (tmp_path / "out").exists()  # nothing written


def test_logged_baseline_is_the_running_mean_of_earlier_rewards(tmp_path):
    """β = 0: R = r, so the baseline logged at step k is the mean reward of steps 1..k−1 (equal batch sizes)."""
    reinforce.main(args(tmp_path, beta=0.0, max_steps=4, save_steps=4))
    records = training_records(tmp_path / "out")
    rewards = [r["reward"] for r in records]
    assert [r["baseline"] for r in records] == pytest.approx([0.0] + [sum(rewards[:k]) / k for k in range(1, 4)])
    state = training_state(tmp_path / "out" / "checkpoint-4")
    assert state["reward_count"] == 4 * 8 and state["reward_sum"] == pytest.approx(8 * sum(rewards))


def test_the_moving_average_holds_the_kl_shaped_reward(tmp_path):
    """Σ_i R_i = Σ_i r_i − β Σ_{i,t} kl_{i,t}; the log has the mean reward, the token-mean KL and the mean length."""
    reinforce.main(args(tmp_path, beta=0.5, max_steps=2, save_steps=2))
    records = training_records(tmp_path / "out")
    state = training_state(tmp_path / "out" / "checkpoint-2")
    assert records[0]["kl"] == 0.0 and records[1]["kl"] != 0.0  # the policy is the reference until the first update
    shaped_sum = sum(8 * r["reward"] - 0.5 * r["kl"] * r["completions/mean_length"] * 8 for r in records)
    assert state["reward_sum"] == pytest.approx(shaped_sum, rel=1e-4, abs=1e-5)
    assert records[1]["baseline"] == pytest.approx(records[0]["reward"])  # step 1's R = r: no KL yet


def test_resume_reproduces_the_uninterrupted_run_and_its_running_mean(tmp_path):
    full = args(tmp_path, max_steps=4, save_steps=2, beta=0.1, num_iterations=2, num_generations=2, prompts_per_step=4)
    reinforce.main(full)
    resumed = dataclasses.replace(
        full, output_dir=str(tmp_path / "resumed"), resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2")
    )
    reinforce.main(resumed)
    uninterrupted = training_records(tmp_path / "out")
    assert [r["step"] for r in uninterrupted] == [1, 2, 3, 4]
    assert training_records(tmp_path / "resumed") == uninterrupted[2:]  # the logged baseline included
    a, b = training_state(tmp_path / "out" / "checkpoint-4"), training_state(tmp_path / "resumed" / "checkpoint-4")
    assert (a["reward_sum"], a["reward_count"]) == (b["reward_sum"], b["reward_count"])
    final = load_file(tmp_path / "out" / "model.safetensors")
    again = load_file(tmp_path / "resumed" / "model.safetensors")
    assert all(torch.equal(final[k], again[k]) for k in final)


@pytest.mark.parametrize("baseline", ["moving_average", "reinforce_pp"])
def test_micro_batching_does_not_change_the_update(tmp_path, recorded_gradients, baseline):
    """Including REINFORCE++'s whitening over the whole batch, whose KL-shaped rewards need every micro-batch first.
    The runs start one step in, so that the policy differs from the reference and the KL shapes the rewards."""
    setup = dict(baseline=baseline, beta=0.5)  # a resumed run keeps its checkpoint's objective
    reinforce.main(args(tmp_path, max_steps=1, save_steps=1, output_dir=str(tmp_path / "start"), **setup))
    gradients = recorded_gradients
    gradients.clear()  # from here on: the two runs compared
    whole = args(
        tmp_path,
        max_steps=2,
        **setup,
        resume_from_checkpoint=str(tmp_path / "start" / "checkpoint-1"),
        output_dir=str(tmp_path / "whole"),
    )
    reinforce.main(whole)
    reinforce.main(dataclasses.replace(whole, micro_batch_size=2, output_dir=str(tmp_path / "micro")))
    one_batch, micro_batches = gradients
    assert one_batch.abs().max() > 0
    assert torch.allclose(one_batch, micro_batches, rtol=1e-4, atol=1e-7)
    (ra,), (rb,) = training_records(tmp_path / "whole"), training_records(tmp_path / "micro")
    assert ra["kl"] != 0.0
    for key in ("loss", "baseline", "kl"):
        assert ra[key] == pytest.approx(rb[key], rel=1e-4, abs=1e-6), key


def test_several_generations_per_prompt(tmp_path):
    reinforce.main(args(tmp_path, num_generations=4, prompts_per_step=2, max_steps=1))
    (record,) = training_records(tmp_path / "out")
    assert 0.0 <= record["frac_reward_zero_std"] <= 1.0 and record["num_tokens"] > 0


@pytest.mark.slow
def test_default_run_learns(tmp_path):
    """A shortened default run raises held-out sampled accuracy."""
    reinforce.main(reinforce.Args(output_dir=str(tmp_path / "out"), max_steps=60, eval_steps=0))
    evals = [r for r in common.read_metrics(tmp_path / "out") if "eval/accuracy" in r]
    assert evals[-1]["eval/accuracy"] - evals[0]["eval/accuracy"] >= 0.1
