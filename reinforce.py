"""REINFORCE: sequence-level policy gradient with a moving-average baseline, for language models (Ahmadian et al.
2024, "Back to Basics").

For every prompt x, sample G = num_generations completions y_1..y_G (G = 1 by default, the paper's REINFORCE) from the
policy π_θ at temperature τ (--temperature) and score them with the reward r (a weighted sum of reward functions, or
a reward model).
The whole completion is one action. Then:

    KL-shaped reward (the KL is a penalty inside the reward, computed on the sampled tokens, not differentiated)
        R_i = r(x, y_i) − β · Σ_t kl_{i,t}
        kl_{i,t} = log π_θ(y_t | x, y_<t) − log π_ref(y_t | x, y_<t)                     (k1, the default)
        kl_{i,t} = exp(log π_ref − log π_θ) − (log π_ref − log π_θ) − 1                    (k3, --kl_estimator k3)
        (as a reward, k3 estimates the KL's value without bias but its policy gradient E[k3 · ∇log π] is not ∇KL;
         k1's is: ∇KL = E[k1 · ∇log π], since E[∇log π] = 0)

    Baseline and advantage (Eq. 6–8)
        --baseline none              A_i = R_i                                     plain REINFORCE (Eq. 6)
        --baseline moving_average    A_i = R_i − b_MA,  b_MA = 1/S Σ_s R_s       (Eq. 7 with the b of Eq. 8; default)
        --baseline reinforce_pp      A_i = (R_i − mean_B R) / (std_B R + 1e-4)   REINFORCE++ (Hu 2025): batch-whitened
    b_MA is the mean of all S shaped rewards of the steps BEFORE this one (0 at the first step): a running mean over
    training, shared by all prompts, not an EMA. It never includes R_i itself, so the gradient stays unbiased; its sum
    and count are saved in checkpoints, so a resumed run continues with the same baseline.

    Sequence-level clipped surrogate over the B = prompts_per_step · G completions
        ρ_i = π_θ(y_i | x) / π_θ_old(y_i | x) = exp(Σ_t log π_θ(y_{i,t}) − Σ_t log π_θ_old(y_{i,t}))
        L(θ) = −Σ_i w_i · min(ρ_i A_i, clip(ρ_i, 1 − ε, 1 + ε_high) A_i),      w_i = m_i · is_i / B
    with m_i = 0 for a completion without EOS under --mask_truncated_completions (else 1), and is_i the sampler
    correction when vLLM or the --bf16 copy samples instead of π_θ (TRL's importance sampling):
        is_i = π_θ_old(y_i | x) / π_sampler(y_i | x), capped at C (sequence_truncate) or 0 above C; else 1

With num_iterations = 1 (the default) the completions are used once: ρ ≡ 1, ∇L = −1/B Σ_i (R_i − b) ∇ log π_θ(y_i | x)
(Eq. 7). Worked example (moving average, B = 4): rewards 1, 0, 1, 1 at step 1 have b = 0 and advantages 1, 0, 1, 1;
rewards 0, 0, 1, 0 at step 2 have b = 3/4 and advantages −0.75, −0.75, +0.25, −0.75; at step 3, b = 4/8 = 0.5.
REINFORCE++ as in OpenRLHF puts the KL on each token and whitens token-level returns-to-go; here the action is the
whole sequence, so its return R_i is what is whitened.

Before any update, a policy pass gives log π_θ_old (the policy that sampled) and a reference pass log π_ref, so the
whole batch's advantages are known before the first backward pass; with one micro-batch (the default) that policy pass
keeps its graph and is the first update's forward. Under `accelerate launch` each process samples and scores its share
of the prompts; the whole batch's R are gathered, so b_MA and REINFORCE++'s mean and std are the same on every
process, and DDP's mean of the gradients is the one-process update (tested).
Sampling draws from softmax(logits / τ), the log-probs' distribution; --top_k and --top_p make training off-policy.

Copy reinforce.py with common.py (plumbing: arguments, data, processes, sampling, evaluation, checkpoints, logging)
and rewards.py (reward functions, reward-model scoring; it stands alone); vllm_colocate.py only for --use_vllm.

    python reinforce.py                                     # the embedded tiny model, offline, ~45 s on a 2-core CPU
"""

from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.utils.checkpoint
from accelerate.utils import set_seed

import common
from common import arg, require
from rewards import compute_rewards

BASELINES = ("none", "moving_average", "reinforce_pp")


@dataclass
class Args(common.Args):
    """This script's flags; the ones every algorithm script shares are in common.Args (`--help` lists all)."""

    num_generations: int = arg(1, "completions sampled per prompt (1: the paper's REINFORCE; more: more samples)")
    baseline: str = arg("moving_average", "b in R − b: none, moving_average (mean of all past R) or reinforce_pp")
    beta: float = arg(0.05, "KL coefficient β in the shaped reward; 0 skips the reference model entirely")
    kl_estimator: str = arg("k1", "KL estimator in the reward: k1 or k3 (k3's gradient is not the KL's)")
    num_iterations: int = arg(1, "optimizer steps on each batch of completions (>1: the ratio and clipping matter)")
    epsilon: float = arg(0.2, "lower clipping bound ε of the sequence ratio")
    epsilon_high: float | None = arg(None, "upper clipping bound (default: epsilon)")
    reward_clip_range: list[float] | None = arg(None, "clip the reward to [low, high] before KL shaping, e.g. -5 5")
    mask_truncated_completions: bool = arg(False, "completions without EOS get no loss (they count in the baseline)")
    # this script's defaults of common.Args' flags
    prompts_per_step: int = 32
    max_steps: int = 100
    output_dir: str = "outputs/reinforce"
    save_steps: int = 50


def check_args(args: Args):
    common.check_shared_args(args)  # the flags every script shares: learning rate, steps, sampling, output_dir, ...
    require(args.num_generations >= 1, f"--num_generations: must be ≥ 1, got {args.num_generations}")
    require(args.baseline in BASELINES, f"--baseline: expected one of {', '.join(BASELINES)}, got {args.baseline!r}")
    batch_size = args.prompts_per_step * args.num_generations
    require(
        args.baseline != "reinforce_pp" or batch_size >= 2,
        f"--baseline: reinforce_pp whitens over the batch and needs at least 2 completions per step, got {batch_size}",
    )
    require(
        args.vllm_importance_sampling_mode.startswith("sequence"),
        "--vllm_importance_sampling_mode: the whole completion is one action here: sequence_mask or sequence_truncate, "
        f"got {args.vllm_importance_sampling_mode!r}",
    )


# ----------------------------------------------------------------------------------------------------------------------
# The two quantities every equation above reads: the log-probs at the temperature, and where each completion ends.
# The same text in rloo.py, grpo.py, reinforce.py and ppo.py.
# ----------------------------------------------------------------------------------------------------------------------
def completion_logprobs(model, input_ids, attention_mask, T: int, temperature: float, entropy=False, chunk=2**24):
    """log π(y_t | x, y_<t) (B, T), in float32, of the last T tokens of `input_ids` (the completion) under
    softmax(logits / temperature); with `entropy=True` also that softmax's detached entropy (B, T), else None.

    Only the T completion positions get logits (`logits_to_keep`). The float32 log-softmax exists for `chunk` elements
    at a time, never (B, T, V) whole, and the backward pass recomputes it (checkpointing). Position ids come from the
    attention mask, as in generation (left padding)."""
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    # T + 1 positions: the last prompt position predicts the first completion token
    output = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, logits_to_keep=T + 1)
    logits = output.logits[:, :-1]  # (B, T, V): position t predicts completion token t
    positions = max(1, chunk // (logits.shape[0] * logits.shape[2]))
    pieces = list(zip(logits.split(positions, 1), input_ids[:, -T:].split(positions, 1)))
    recompute = torch.utils.checkpoint.checkpoint
    logprobs = torch.cat([recompute(logprobs_of, z, y, temperature, use_reentrant=False) for z, y in pieces], 1)
    if not entropy:
        return logprobs, None
    with torch.no_grad():
        return logprobs, torch.cat([entropy_of(z, temperature) for z, _ in pieces], 1)


def logprobs_of(logits, targets, temperature: float):
    """log softmax(logits / temperature) at the targets, in float32. (B, t, V), (B, t) -> (B, t)"""
    return torch.log_softmax(logits.float() / temperature, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def entropy_of(logits, temperature: float):
    """The entropy of softmax(logits / temperature), in float32. (B, t, V) -> (B, t)"""
    logits = logits.float() / temperature
    return logits.logsumexp(-1) - (torch.softmax(logits, -1) * logits).sum(-1)


def end_of_completion(completion_ids: torch.Tensor, end_ids: int | list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """A completion ends at its first end token (kept). Returns its mask (B, T), 1 up to and including that token, and
    is_truncated (B,): True where no end token came within max_completion_length."""
    is_end = torch.isin(completion_ids, torch.tensor(end_ids, device=completion_ids.device))
    first_end = torch.where(is_end.any(1), is_end.int().argmax(1), completion_ids.shape[1])
    positions = torch.arange(completion_ids.shape[1], device=completion_ids.device)
    return (positions[None] <= first_end[:, None]).long(), ~is_end.any(1)


def importance_sampling_weights(old_logprobs, sampler_logprobs, completion_mask, *, mode: str, clip_max: float):
    """TRL's importance-sampling correction for a sampler that is not π_θ (vLLM, the bf16 copy): the ratio
    π_θ_old / π_sampler of each completion (sequence_*: the exp of its summed log-ratio, (B, 1)) or of each token
    (token_*: (B, T)), capped at clip_max (*_truncate) or zeroed above it (*_mask)."""
    log_ratio = (old_logprobs - sampler_logprobs) * completion_mask
    if mode.startswith("sequence"):
        log_ratio = log_ratio.sum(1, keepdim=True)
    ratio = torch.exp(log_ratio)
    return ratio.clamp(max=clip_max) if mode.endswith("truncate") else ratio.masked_fill(ratio > clip_max, 0.0)


def per_token_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """kl_t for each sampled token: k1 = log π − log π_ref (unbiased), k3 = exp(−k1) + k1 − 1 (unbiased, ≥ 0)."""
    log_ratio = logprobs - ref_logprobs
    return log_ratio if estimator == "k1" else torch.exp(-log_ratio) + log_ratio - 1


def reinforce_advantages(shaped_rewards, *, baseline: str, reward_sum: float, reward_count: int, batch_rewards=None):
    """A_i = R_i − b. none: b = 0; moving_average: b = reward_sum / reward_count, the mean of every R of the previous
    steps (0 before the first); reinforce_pp: (R_i − mean R) / (std R + 1e-4) over batch_rewards, the R of the whole
    batch (default: these R; with several processes, every process's). (B,) -> (B,)
    An unscorable completion (R_i = NaN: no reward function applies) stays out of the statistics and gets A_i = 0."""
    if baseline == "reinforce_pp":
        batch_rewards = shaped_rewards if batch_rewards is None else batch_rewards
        advantages = (shaped_rewards - batch_rewards.nanmean()) / (common.nanstd(batch_rewards) + 1e-4)
    elif baseline == "moving_average":
        advantages = shaped_rewards - (reward_sum / reward_count if reward_count else 0.0)
    else:
        advantages = shaped_rewards
    return advantages.nan_to_num(0.0)


def reinforce_loss(
    logprobs, old_logprobs, completion_mask, advantages, weights, *, epsilon: float, epsilon_high: float
):
    """−Σ_i w_i min(ρ_i A_i, clip(ρ_i, 1−ε, 1+ε_high) A_i) over this micro-batch, with ρ_i the sequence ratio and w_i
    (B_mb,) the completions' weights in the loss. Returns the loss and ρ (B_mb,)."""
    seq_logprobs = (logprobs * completion_mask).sum(1)
    old_seq_logprobs = (old_logprobs * completion_mask).sum(1)
    ratio = torch.exp(seq_logprobs - old_seq_logprobs)  # ≡ 1 (with gradient ∇ log π) when old = logprobs.detach()
    surrogate = torch.min(ratio * advantages, ratio.clamp(1 - epsilon, 1 + epsilon_high) * advantages)
    return -(surrogate * weights).sum(), ratio


def main(args: Args):
    check_args(args)
    accelerator = common.make_accelerator(args)  # one process, or N under `accelerate launch`
    set_seed(args.seed, device_specific=True)  # seed + process index: each process samples its own completions
    device = accelerator.device
    G = args.num_generations
    # this process's prompts, its completions (whole groups of G) and the completions per forward and backward
    my_prompts, local_batch_size, micro_batch_size = common.process_share(accelerator, args, G)
    epsilon_high = args.epsilon if args.epsilon_high is None else args.epsilon_high

    # ---- plumbing: data, policy π_θ and reference π_ref (only when β > 0), reward functions, optimizer ----
    datasets = train_dataset, eval_dataset = common.load_data(accelerator, args)
    checkpoint = common.resolve_checkpoint(args.resume_from_checkpoint, args.output_dir, args)
    tokenizer, model, ref_model, generation_config = common.load_policy_and_reference(
        accelerator, args, datasets, args.beta > 0
    )
    reward_funcs, weights = common.load_rewards(accelerator, args, datasets)
    total_updates = args.max_steps * args.num_iterations
    model, optimizer, scheduler = common.prepare_training(accelerator, args, total_updates, model)  # AdamW, DDP, ...
    columns = [c for c in train_dataset.column_names if c != "prompt"]

    def reference_logprobs(input_ids, attention_mask, T):
        policy = accelerator.unwrap_model(model)
        with torch.no_grad(), accelerator.autocast(), policy.disable_adapter() if args.use_peft else nullcontext():
            return completion_logprobs(ref_model or policy, input_ids, attention_mask, T, args.temperature)[0]

    def rollout_and_score(rows) -> dict:
        """Phases 1 and 2 for this process's prompts `rows`: the tensors and texts of the rollout, and the rewards."""
        # ==== 1. rollout: G completions per prompt, each ended at its first end token ====
        prompts = [p for p in rows["prompt"] for _ in range(G)]  # each prompt's G completions are contiguous
        rollout = run.sample(prompts)  # chat prompts through the tokenizer's chat template
        completion_mask, is_truncated = end_of_completion(rollout["completion_ids"], generation_config.eos_token_id)
        completion_ids = rollout["completion_ids"].masked_fill(completion_mask == 0, tokenizer.pad_token_id)  # (B, T)

        # ==== 2. score: r(x, y_i), the weighted sum of the reward functions ====
        completion_texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        completion_id_lists = [ids[mask.bool()].tolist() for ids, mask in zip(completion_ids, completion_mask)]
        row_columns = {c: [v for v in rows[c] for _ in range(G)] for c in columns}
        rewards, rewards_per_func = compute_rewards(
            reward_funcs, weights, prompts, completion_texts, completion_id_lists, row_columns
        )
        return {
            **rollout,
            "prompts": prompts,
            "completion_ids": completion_ids,
            "completion_mask": completion_mask,
            "is_truncated": is_truncated,
            "completion_texts": completion_texts,
            "rewards": rewards,
            "rewards_per_func": rewards_per_func,
        }

    # ==== the training loop: the algorithm (1-6), the log (7); common.Run resumes, evaluates, saves and stops ====
    with common.Run(
        accelerator, args, "reinforce", model, tokenizer, scheduler, checkpoint, generation_config, reward_funcs,
        weights, eval_dataset, state={"reward_sum": 0.0, "reward_count": 0},  # b_MA's sum and count of every R so far
    ) as run:  # fmt: skip
        for step in run.steps():
            logging_step = step % args.logging_steps == 0 or step == args.max_steps  # entropy then

            # ==== 1-2. rollout and score (rollout_and_score, above) ====
            rows = common.rows_of_step(train_dataset, step, args.prompts_per_step, args.seed, my_prompts)
            batch = rollout_and_score(rows)
            completion_ids, completion_mask = batch["completion_ids"], batch["completion_mask"]  # (B, T)
            input_ids = torch.cat([batch["prompt_ids"], completion_ids], 1)
            attention_mask = torch.cat([batch["prompt_mask"], completion_mask], 1)
            T = completion_ids.shape[1]
            rewards = batch["rewards"].to(device)
            if args.reward_clip_range is not None:
                rewards = rewards.clamp(*args.reward_clip_range)

            # ==== 3. log-probs before any update: π_θ_old (the policy that sampled) and π_ref ====
            # One micro-batch (the default): this forward keeps its graph for the first update; several: no gradient
            micro_batches = torch.arange(local_batch_size, device=device).split(micro_batch_size)
            one_pass = len(micro_batches) == 1
            old_logprobs, ref_logprobs, entropy = torch.zeros(3, local_batch_size, T, device=device)
            for mb in micro_batches:
                with torch.set_grad_enabled(one_pass), accelerator.autocast():
                    logprobs, token_entropy = completion_logprobs(
                        model, input_ids[mb], attention_mask[mb], T, args.temperature, entropy=logging_step
                    )
                old_logprobs[mb] = logprobs.detach()  # π_θ_old = π_θ before the update
                entropy[mb] = token_entropy if logging_step else 0.0
                ref_logprobs[mb] = (  # β = 0: no reference model, and kl = 0
                    reference_logprobs(input_ids[mb], attention_mask[mb], T) if args.beta > 0 else old_logprobs[mb]
                )

            # ==== 4. KL-shaped reward: R_i = r_i − β Σ_t kl_t ====
            kl = per_token_kl(old_logprobs, ref_logprobs, args.kl_estimator) * completion_mask  # (B, T)
            shaped_rewards = rewards - args.beta * kl.sum(1)
            all_shaped_rewards = accelerator.gather(shaped_rewards)  # the whole batch's R_i, (B,)

            # ==== 5. advantages over the batch: A_i = R_i − b (b_MA of the steps before, or REINFORCE++) ====
            advantages = reinforce_advantages(  # run.state: b_MA's reward_sum and reward_count
                shaped_rewards, baseline=args.baseline, batch_rewards=all_shaped_rewards, **run.state
            )
            # each completion's weight in the loss, w_i = m_i · is_i / B: is_i = π_θ_old / π_sampler (capped or masked
            # at C) when vLLM or the bf16 copy sampled, not π_θ; m_i = 0 without EOS under --mask_truncated_completions
            off_policy = args.vllm_importance_sampling_correction and "sampler_logprobs" in batch
            is_weights = torch.ones(local_batch_size, 1, device=device)
            if off_policy:
                is_weights = importance_sampling_weights(
                    old_logprobs,
                    batch["sampler_logprobs"],
                    completion_mask,
                    mode=args.vllm_importance_sampling_mode,
                    clip_max=args.vllm_importance_sampling_clip_max,
                )
            loss_weights = is_weights[:, 0] / local_batch_size
            if args.mask_truncated_completions:
                loss_weights = loss_weights * ~batch["is_truncated"]

            # ==== 6. loss and update: num_iterations passes over the batch, micro-batches accumulated ====
            # Each process's loss is the mean over its completions (w_i), and DDP's mean over processes the batch's.
            clip_low, clip_high, losses, grad_norms = [], [], [], []
            for iteration in range(args.num_iterations):
                loss_sum = 0.0
                for mb in run.accumulate(micro_batches):  # gradients all-reduced once per update
                    if not (one_pass and iteration == 0):  # else phase 3's forward, graph and all
                        with accelerator.autocast():
                            logprobs = completion_logprobs(
                                model, input_ids[mb], attention_mask[mb], T, args.temperature
                            )[0]
                    loss, ratio = reinforce_loss(
                        logprobs,
                        old_logprobs[mb],
                        completion_mask[mb],
                        advantages[mb],
                        loss_weights[mb],
                        epsilon=args.epsilon,
                        epsilon_high=epsilon_high,
                    )
                    accelerator.backward(loss)
                    loss_sum += loss.item()
                    A = advantages[mb]
                    clip_low.append(((ratio < 1 - args.epsilon) & (A < 0)).float().mean().item())
                    clip_high.append(((ratio > 1 + epsilon_high) & (A > 0)).float().mean().item())
                grad_norms.append(float(accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)))
                # before the update: a NaN reward marks an unscorable completion, anything else not finite stops here
                scorable = ~batch["rewards_per_func"].isnan().all(1)
                run.check_finite(reward=rewards[scorable], loss=loss_sum, grad_norm=grad_norms[-1])
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                losses.append(loss_sum)
            baseline = {
                "none": 0.0,
                "moving_average": run.state["reward_sum"] / max(run.state["reward_count"], 1),
                "reinforce_pp": all_shaped_rewards.nanmean().item(),
            }[args.baseline]
            # this batch joins the moving average only after its own update (the same sum and count on every process)
            run.state["reward_sum"] += all_shaped_rewards.nansum().item()
            run.state["reward_count"] += (~all_shaped_rewards.isnan()).sum().item()
            run.reward_signal(bool(common.nanstd(accelerator.gather(rewards)) > 1e-6))  # not all scored the same
            run.count_tokens(attention_mask)

            # ==== 7. log: statistics over the whole batch, from every process ====
            if logging_step:
                logged_kl = kl if args.beta > 0 else None  # β = 0: no reference, no KL
                metrics = common.rollout_metrics(accelerator, batch, rewards, reward_funcs, G, logged_kl, entropy)
                metrics |= {"baseline": baseline}
                metrics |= common.update_metrics(accelerator, losses, grad_norms, clip_low, clip_high)
                if off_policy:
                    metrics |= common.sampling_metrics(
                        accelerator, old_logprobs, batch["sampler_logprobs"], is_weights, completion_mask
                    )
                run.log(step, metrics, (batch["prompts"], batch["completion_texts"], rewards))


if __name__ == "__main__":
    common.cli(main, Args)
