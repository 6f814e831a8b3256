"""reinforce.py: the docstring's worked example, the moving average's update, REINFORCE++'s whitening, the plain
REINFORCE gradient and the KL-shaped reward on known values; then end to end: the logged baseline, exact resume with
the moving average restored, micro-batch invariance, bad input, and a run that learns."""

import dataclasses
import json
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file

import reinforce
from conftest import ROOT, error_line, one_line_error, read_metrics, run_main, run_script
from reinforce import per_token_kl, reinforce_advantages, reinforce_loss


def args(tmp_path, **overrides) -> reinforce.Args:
    """A run of a few seconds: 2 steps of 8 prompts, one completion each, no evaluation, no checkpoint."""
    small = dict(
        max_steps=2,
        prompts_per_step=8,
        logging_steps=1,
        eval_steps=0,
        eval_strategy="no",
        save_steps=0,
    )
    return reinforce.Args(**{**small, "output_dir": str(tmp_path / "out"), **overrides})


def training(output_dir) -> list[dict]:
    return [
        {k: v for k, v in r.items() if k != "step_time"}
        for r in read_metrics(output_dir)
        if "loss" in r
    ]


def trainer_state(checkpoint) -> dict:
    return json.loads((checkpoint / "trainer_state.json").read_text())


def advantages_of(rewards, baseline="moving_average", **running):
    """A, b and b_MA's new sum and count for the whole batch's R on one process."""
    rewards = torch.tensor(rewards)
    return reinforce_advantages(
        rewards, rewards, baseline=baseline, **{"reward_sum": 0.0, "reward_count": 0, **running}
    )


# ---- the estimators on known values ----
def test_the_docstrings_worked_example():
    """Rewards 1, 0, 1, 1 at step 1 have b = 0 and advantages 1, 0, 1, 1; rewards 0, 0, 1, 0 at step 2 have b = 3/4 and
    advantages −0.75, −0.75, +0.25, −0.75; at step 3, b = 4/8 = 0.5."""
    advantages, b, running = advantages_of([1.0, 0.0, 1.0, 1.0])
    assert (b, advantages.tolist()) == (0.0, [1.0, 0.0, 1.0, 1.0])
    advantages, b, running = advantages_of([0.0, 0.0, 1.0, 0.0], **running)
    assert (b, advantages.tolist()) == (0.75, [-0.75, -0.75, 0.25, -0.75])
    assert advantages_of([1.0], **running)[1] == 0.5


def test_the_moving_average_is_the_mean_of_every_earlier_reward_not_an_ema():
    """b_MA's sum and count take in each batch after its own advantages; an unscorable R (NaN) is left out of them and
    gets A = 0."""
    _, _, running = advantages_of([2.0, float("nan"), 4.0], reward_sum=10.0, reward_count=4)
    assert running == {"reward_sum": 16.0, "reward_count": 6}
    advantages, b, running = advantages_of([1.0, 0.0], **running)  # b = 16/6, whatever the batch
    assert b == pytest.approx(16 / 6)
    assert advantages.tolist() == pytest.approx([1 - 16 / 6, -16 / 6])
    assert running == {"reward_sum": 17.0, "reward_count": 8}
    advantages, b, running = advantages_of([float("nan"), 3.0], **running)
    assert b == pytest.approx(17 / 8)
    assert advantages.tolist() == pytest.approx([0.0, 3 - 17 / 8])
    assert running["reward_count"] == 9


def test_reinforce_pp_whitens_over_the_whole_batch():
    advantages, b, _ = advantages_of(
        [1.0, 0.0, 1.0, 1.0], "reinforce_pp", reward_sum=123.0, reward_count=7
    )
    assert b == 0.75  # the batch's mean R; the running mean plays no part (unbiased std: 0.5)
    assert advantages.tolist() == pytest.approx(
        [0.25 / 0.5001, -0.75 / 0.5001, 0.25 / 0.5001, 0.25 / 0.5001]
    )
    assert advantages_of([1.0] * 4, "reinforce_pp")[0].tolist() == [0.0] * 4
    # one process of several whitens its R with every process's: its rows of the one-process advantages
    batch = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.5])
    whole = advantages_of(batch.tolist(), "reinforce_pp")[0]
    first_process = reinforce_advantages(
        batch[:2], batch, baseline="reinforce_pp", reward_sum=0.0, reward_count=0
    )[0]
    assert first_process.tolist() == pytest.approx(whole[:2].tolist())


def test_without_a_baseline_the_gradient_is_reinforces():
    """∇L = −1/B Σ_i R_i ∇ Σ_t log π(y_i,t) (Eq. 6), padding excluded; ρ ≡ 1 on the first pass."""
    rewards = torch.tensor([1.0, 0.0, 0.5])
    advantages, b, _ = advantages_of(rewards.tolist(), "none", reward_sum=10.0, reward_count=4)
    assert b == 0
    assert advantages.tolist() == rewards.tolist()
    logprobs = torch.tensor([[-1.0, -2.0], [-0.5, -0.1], [-3.0, -0.2]], requires_grad=True)
    mask = torch.tensor([[1, 1], [1, 0], [1, 1]])
    loss, ratio = reinforce_loss(
        logprobs,
        logprobs.detach(),
        mask,
        advantages,
        torch.ones(3) / 3,
        epsilon=0.2,
        epsilon_high=0.2,
    )
    loss.backward()
    assert ratio.tolist() == [1.0] * 3
    assert loss.item() == pytest.approx(-rewards.mean().item())
    assert torch.allclose(logprobs.grad, -(rewards[:, None] * mask) / 3)


def test_the_sequence_ratio_is_clipped():
    # ρ = e^0.5 ≈ 1.65 (A = 1) and e^−0.5 ≈ 0.61 (A = −1): both clipped
    logprobs = torch.tensor([[0.5], [-0.5]], requires_grad=True)
    advantages = torch.tensor([1.0, -1.0])
    weights = torch.ones(2) / 2
    loss, _ = reinforce_loss(
        logprobs,
        torch.zeros(2, 1),
        torch.ones(2, 1),
        advantages,
        weights,
        epsilon=0.2,
        epsilon_high=0.28,
    )
    loss.backward()
    assert logprobs.grad.abs().sum().item() == 0.0
    assert loss.item() == pytest.approx(-(1.28 - 0.8) / 2)


def test_the_kl_estimators_and_the_kl_shaped_reward():
    logprobs = torch.tensor([[math.log(0.5), math.log(0.5)]])
    ref_logprobs = torch.tensor([[math.log(0.25), math.log(0.5)]])
    k1 = per_token_kl(logprobs, ref_logprobs, "k1")
    k3 = per_token_kl(logprobs, ref_logprobs, "k3")
    assert k1[0].tolist() == pytest.approx([math.log(2), 0.0])
    assert k3[0].tolist() == pytest.approx([0.5 + math.log(2) - 1, 0.0])
    shaped = 1.0 - 0.1 * k1.sum().item()  # R = r − β Σ_t kl_t, then the baseline
    assert advantages_of([shaped], reward_sum=1.0, reward_count=4)[0].item() == pytest.approx(
        shaped - 0.25
    )


# ---- end to end ----
def test_the_logged_baseline_is_the_running_mean_of_the_earlier_rewards(tmp_path):
    """β = 0: R = r, so the baseline logged at step k is the mean reward of steps 1..k−1 (equal batches), and the
    checkpoint holds b_MA's sum and count."""
    reinforce.main(args(tmp_path, beta=0.0, max_steps=4, save_steps=4))
    records = training(tmp_path / "out")
    rewards = [r["reward"] for r in records]
    assert [r["baseline"] for r in records] == pytest.approx(
        [0.0] + [sum(rewards[:k]) / k for k in (1, 2, 3)]
    )
    state = trainer_state(tmp_path / "out" / "checkpoint-4")
    assert state["reward_count"] == 4 * 8
    assert state["reward_sum"] == pytest.approx(8 * sum(rewards))
    assert "kl" not in records[0]  # no reference model
    assert "frac_reward_zero_std" not in records[0]  # groups of one


def test_the_reward_is_clipped_before_the_kl_shaping(tmp_path):
    """R = clip(r) − β Σ_t kl_t: b_MA holds the clipped reward; the log has the reward functions' own."""
    (tmp_path / "big.py").write_text(
        "def big(completions, **kwargs):\n    return [7.0] * len(completions)\n"
    )
    reinforce.main(
        args(
            tmp_path,
            reward_funcs=[f"{tmp_path / 'big.py'}:big"],
            reward_clip_range=[-1.0, 2.0],
            beta=0,
        )
    )
    assert [(r["reward"], r["baseline"]) for r in training(tmp_path / "out")] == [
        (7.0, 0.0),
        (7.0, 2.0),
    ]


def test_a_stopped_and_resumed_run_equals_the_uninterrupted_run(tmp_path):
    """The run stopped after step 2 (what its folder then holds: checkpoint-2 and the metrics so far) and resumed logs
    what the 4-step run logs, the baseline included: b_MA's sum and count come back with the checkpoint."""
    full = args(
        tmp_path,
        max_steps=4,
        save_steps=2,
        beta=0.1,
        num_iterations=2,
        num_generations=2,
        prompts_per_step=4,
        eval_strategy="steps",
        num_generations_eval=1,
    )
    reinforce.main(full)
    out = tmp_path / "out"
    stopped = tmp_path / "stopped"
    shutil.copytree(out / "checkpoint-2", stopped / "checkpoint-2")
    # the resumed run drops the lines after step 2
    shutil.copy(out / "metrics.jsonl", stopped / "metrics.jsonl")
    resumed = dataclasses.replace(full, output_dir=str(stopped), resume_from_checkpoint="latest")
    reinforce.main(resumed)
    strip = lambda records: [{k: v for k, v in r.items() if k != "step_time"} for r in records]
    assert strip(read_metrics(stopped)) == strip(read_metrics(out))
    records = training(out)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert records[2]["baseline"] != 0.0
    # b_MA holds the KL-shaped R: Σ_i R_i = Σ_i r_i − β Σ_i,t kl_i,t, with B = 8 completions a step
    shaped_sum = sum(
        8 * (r["reward"] - 0.1 * r["kl"] * r["completions/mean_length"]) for r in records[:2]
    )
    assert trainer_state(out / "checkpoint-2")["reward_sum"] == pytest.approx(shaped_sum, rel=1e-5)
    assert records[1]["kl"] != 0.0
    assert trainer_state(stopped / "checkpoint-4") == trainer_state(out / "checkpoint-4")
    final, again = (load_file(run / "model.safetensors") for run in (out, stopped))
    assert all(torch.equal(final[k], again[k]) for k in final)


@pytest.mark.parametrize("baseline", ["moving_average", "reinforce_pp"])
def test_micro_batching_does_not_change_the_update(
    tmp_path, recorded_gradients, baseline, monkeypatch
):
    """The batch's R (KL-shaped: one step in, the policy is not the reference) and b are known before the first
    backward pass, so micro-batches of 2 accumulate the one-batch gradient, REINFORCE++'s whitening included. Both runs
    resume one checkpoint, so that they start from the same weights."""
    flags = dict(baseline=baseline, beta=0.5, num_generations=2, prompts_per_step=4)
    reinforce.main(
        args(tmp_path, max_steps=1, save_steps=1, output_dir=str(tmp_path / "start"), **flags)
    )
    recorded_gradients.clear()
    scored, score = [], reinforce.compute_rewards  # each batch's (rewards, per function)
    monkeypatch.setattr(
        reinforce, "compute_rewards", lambda *p, **k: scored.append(score(*p, **k)) or scored[-1]
    )
    whole = args(
        tmp_path, **flags, resume_from_checkpoint=str(tmp_path / "start" / "checkpoint-1")
    )
    reinforce.main(dataclasses.replace(whole, output_dir=str(tmp_path / "a")))
    reinforce.main(dataclasses.replace(whole, micro_batch_size=2, output_dir=str(tmp_path / "b")))
    one_batch, micro_batches = recorded_gradients
    assert one_batch.abs().max() > 0
    assert torch.allclose(one_batch, micro_batches, rtol=1e-4, atol=1e-7)
    (a,), (b,) = training(tmp_path / "a"), training(tmp_path / "b")
    assert a["kl"] != 0.0
    assert a["baseline"] != 0.0
    rewards, _ = scored[0]  # run a's batch
    groups = rewards.view(4, 2)  # 4 prompts, 2 completions each
    assert a["frac_reward_zero_std"] == (groups[:, 0] == groups[:, 1]).float().mean().item()
    for key in ("loss", "baseline", "kl"):
        assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize(
    "flags, line",
    [
        (["--num_generations", "0"], "--num_generations: must be ≥ 1, got 0"),
        (
            ["--baseline", "ema"],
            "--baseline: invalid choice: 'ema' (choose from 'none', 'moving_average', 'reinforce_pp')",
        ),
        (
            ["--baseline", "reinforce_pp", "--prompts_per_step", "1"],
            "--baseline: reinforce_pp needs 2 completions a step",
        ),
        (["--reward_clip_range", "1"], "--reward_clip_range: want low high, got [1.0]"),
        (
            ["--reward_clip_range", "5", "-5"],
            "--reward_clip_range: want low high, got [5.0, -5.0]",
        ),
        (
            ["--kl_estimator", "k2"],
            "--kl_estimator/--kl-estimator: invalid choice: 'k2' (choose from 'k1', 'k3')",
        ),
        (["--micro_batch_size", "3"], "--micro_batch_size: must divide 4 completions"),
    ],
)
def test_bad_input_is_one_line_with_exit_status_2_and_nothing_written(
    tmp_path, flags, line, capsys
):
    out = tmp_path / "out"
    flags = ["--prompts_per_step", "4", *flags, "--eval_strategy", "no", "--output_dir", out]
    assert one_line_error(reinforce, *flags, capsys=capsys) == f"error: {line}"
    assert not out.exists() or not list(out.iterdir())


def test_the_script_itself_says_bad_input_in_one_line(tmp_path):
    result = run_script(
        ROOT / "reinforce.py", "--baseline", "ema", "--output_dir", tmp_path / "out"
    )
    assert error_line(result).startswith("error: --baseline: invalid choice: 'ema'")


@pytest.mark.slow
def test_the_quick_start_learns(tmp_path):
    """`python reinforce.py`, as the docstring says: held-out accuracy rises, sampled and greedy."""
    run_main(reinforce, "--output_dir", tmp_path / "out")
    evals = [r for r in read_metrics(tmp_path / "out") if "eval/accuracy" in r]
    first, last = evals[0], evals[-1]
    assert last["eval/accuracy"] - first["eval/accuracy"] >= 0.15
    assert last["eval/accuracy_greedy"] >= first["eval/accuracy_greedy"]
