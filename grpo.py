"""GRPO: group relative policy optimization (Shao et al. 2024, "DeepSeekMath"), with the Dr. GRPO and DAPO changes.

For every prompt x, sample G = num_generations completions y_1..y_G from the policy π_θ at temperature τ (--temperature)
and score them with the reward r (a weighted sum of reward functions, or a reward model). Then:

    Group-relative advantage (DeepSeekMath §4.1.2, outcome supervision), the same for every token of y_i
        A_i = (r_i − mean_j r_j) / (std + 1e-4)      std of the group's rewards (--scale_rewards group), of the whole
                                                       batch's (batch), or no division at all (none)

    Per-token clipped surrogate, with the KL as a loss term on the current policy (DeepSeekMath Eq. 3, k3 of Eq. 4)
        ρ_{i,t} = π_θ(y_{i,t} | x, y_{i,<t}) / π_θ_old(y_{i,t} | x, y_{i,<t}) = exp(log π_θ − log π_θ_old)
        kl_{i,t} = exp(log π_ref − log π_θ) − (log π_ref − log π_θ) − 1     (differentiated: ∂/∂log π_θ = 1 − π_ref/π_θ)
        ℓ_{i,t} = −min(ρ_{i,t} A_i, clip(ρ_{i,t}, 1 − ε, 1 + ε_high) A_i) + β · kl_{i,t}
        L(θ) = Σ_{i,t} w_{i,t} ℓ_{i,t},   with m the completion mask (0 on whole rows with --mask_truncated_completions)
            --loss_type grpo      w_{i,t} = m_{i,t} / (|y_i| · N)       each sequence's token mean, then the mean
                                                                over the N sequences with a loss (Eq. 3)
            --loss_type dr_grpo   w_{i,t} = m_{i,t} / (B · max_completion_length)        a constant normalizer
            --loss_type dapo      w_{i,t} = m_{i,t} / Σ_{j,s} m_{j,s}   every token of the batch weighs the same
            --loss_type bnpo      the same as dapo here (TRL divides by the tokens of each micro-batch instead)

    Sampler correction, when vLLM or the --bf16 copy samples instead of π_θ (TRL's importance sampling): the surrogate
    term of ℓ_{i,t} (not β · kl) is multiplied by
        w = π_θ_old / π_sampler of y_i (sequence_*) or y_{i,t} (token_*); capped at C (*_truncate), 0 above C (*_mask)

What the follow-ups changed. Dr. GRPO (Liu et al. 2025, §3.1–3.2): dividing by the std favours easy and hard prompts and
dividing by |y_i| favours long wrong answers, so no std (--scale_rewards none) and a constant normalizer
(--loss_type dr_grpo). DAPO (Yu et al. 2025): clip-higher (§3.1, --epsilon_high 0.28, room for unlikely tokens to
grow), dynamic sampling (§3.2, --dynamic_sampling: a group whose rewards are all equal has A = 0 and teaches nothing,
so it is dropped and more prompts are sampled), the token-level loss (§3.3, --loss_type dapo) and overlong filtering
(§3.4, --mask_truncated_completions).

With num_iterations = 1 (the default) the completions are used once: ρ ≡ 1 and ∇L = −Σ_{i,t} w_{i,t} A_i ∇ log
π_θ(y_{i,t}) (+ the KL term). The logged `loss` and `policy_loss` (the loss without its β·kl term) then sit near 0,
because the advantages of each group sum to zero; `grad_norm` shows that the update is not. Worked example (G = 4,
--scale_rewards none): rewards 10, 8, 4, 2 have group mean 6 and advantages +4, +2, −2, −4, which RLOO's leave-one-out
advantages scale by G/(G−1) = 4/3.

A_i depends on the rewards only, so it is known before any backward pass, and one forward per completion and iteration
suffices: the first iteration's log-probs, detached, are π_θ_old. Every normalizer is computed once over the whole
batch, so accumulated micro-batches give exactly the one-batch gradient. Under `accelerate launch` each process
samples and scores whole groups of its share of the prompts; the rewards are gathered (A_i is the whole batch's), the
normalizers counted over every process, and each process's loss is N times its share of the one sum, so that DDP's
mean of the gradients is the one-process update (tested). β = 0 (the default) loads no reference model.
Sampling draws from softmax(logits / τ), the log-probs' distribution; --top_k and --top_p make training off-policy.

Copy grpo.py with common.py (plumbing: arguments, data, processes, sampling, evaluation, checkpoints, logging)
and rewards.py (reward functions, reward-model scoring; it stands alone); vllm_colocate.py only for --use_vllm.

    python grpo.py                                          # the embedded tiny model, offline, ~70 s on a 2-core CPU
"""

from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from accelerate.utils import set_seed

import common
from common import arg, require
from rewards import compute_rewards

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


@dataclass
class Args(common.Args):
    """This script's flags; the ones every algorithm script shares are in common.Args (`--help` lists all)."""

    num_generations: int = arg(8, "completions sampled per prompt (G ≥ 2), the group whose mean is the baseline")
    scale_rewards: str = arg("group", "divide the centered rewards by the std of the group, the batch, or none")
    loss_type: str = arg("dapo", "token weighting of the loss: grpo, bnpo, dr_grpo or dapo (see the module docstring)")
    beta: float = arg(0.0, "coefficient β of the k3 KL term in the loss; 0 skips the reference model entirely")
    num_iterations: int = arg(1, "optimizer steps on each batch of completions (>1: the ratio and clipping matter)")
    epsilon: float = arg(0.2, "lower clipping bound ε of the per-token ratio")
    epsilon_high: float | None = arg(None, "upper clipping bound (default: epsilon; DAPO's clip-higher uses 0.28)")
    mask_truncated_completions: bool = arg(False, "completions without EOS get no loss (they count in the advantages)")
    dynamic_sampling: bool = arg(False, "DAPO: drop groups whose rewards are all equal and sample more prompts")
    max_resample_rounds: int = arg(3, "--dynamic_sampling: extra generation rounds per step at most")
    # this script's defaults of common.Args' flags
    prompts_per_step: int = 8
    max_steps: int = 100
    learning_rate: float = 0.0001
    output_dir: str = "outputs/grpo"
    save_steps: int = 50


def check_args(args: Args):
    common.check_shared_args(args)  # the flags every script shares: learning rate, steps, sampling, output_dir, ...
    G = args.num_generations
    require(G >= 2, f"--num_generations: the group-relative advantage needs at least 2 completions per prompt, got {G}")
    require(
        args.scale_rewards in ("group", "batch", "none"),
        f"--scale_rewards: expected group, batch or none, got {args.scale_rewards!r}",
    )
    require(
        args.loss_type in LOSS_TYPES, f"--loss_type: expected one of {', '.join(LOSS_TYPES)}, got {args.loss_type!r}"
    )
    require(args.max_resample_rounds >= 0, f"--max_resample_rounds: must be ≥ 0, got {args.max_resample_rounds}")


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


def per_token_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 = exp(ref − logp) − (ref − logp) − 1 for each sampled token: unbiased, ≥ 0, gradient 1 − exp(ref − logp)."""
    log_ratio = ref_logprobs - logprobs
    return torch.exp(log_ratio) - log_ratio - 1


def group_relative_advantages(rewards: torch.Tensor, num_generations: int, scale_rewards: str) -> torch.Tensor:
    """A_i = (r_i − mean of its group) / (std + 1e-4), std of the group, of the batch, or none. (B,) -> (B,)

    An unscorable completion (r_i = NaN: no reward function applies) is left out of the means and stds and gets
    A_i = 0, as in TRL."""
    grouped = rewards.view(-1, num_generations)
    centered = grouped - grouped.nanmean(1, keepdim=True)
    if scale_rewards == "group":
        centered = centered / (common.nanstd(grouped, 1)[:, None] + 1e-4)
    elif scale_rewards == "batch":
        centered = centered / (common.nanstd(rewards) + 1e-4)
    return centered.flatten().nan_to_num(0.0)


def loss_token_weights(
    loss_mask: torch.Tensor, loss_type: str, max_completion_length: int, sum_over_processes=lambda count: count
) -> torch.Tensor:
    """w (B, T) of L = Σ_{i,t} w_{i,t} ℓ_{i,t}, normalized over the WHOLE batch; loss_mask (B, T) marks the tokens that
    get a loss (completion tokens, after truncation masking). A micro-batch's loss is its rows' share of the sum. With
    several processes loss_mask holds this process's rows, and sum_over_processes (accelerator.reduce) adds the other
    processes' counts to the normalizer."""
    loss_mask = loss_mask.float()
    if loss_type == "grpo":  # each sequence's token mean, then the mean over the sequences that have a loss
        lengths = loss_mask.sum(1, keepdim=True)
        return loss_mask / lengths.clamp(min=1) / sum_over_processes((lengths > 0).sum()).clamp(min=1)
    if loss_type == "dr_grpo":  # a constant: every token weighs the same, whatever the lengths in this batch
        return loss_mask / sum_over_processes(loss_mask.new_tensor(loss_mask.shape[0] * max_completion_length))
    # dapo and bnpo: every token of the batch weighs the same
    return loss_mask / sum_over_processes(loss_mask.sum()).clamp(min=1)


def grpo_loss(
    logprobs, old_logprobs, ref_logprobs, advantages, weights, is_weights=1.0, *, beta, epsilon, epsilon_high
):
    """Σ_{i,t} w_{i,t} (−is_{i,t} min(ρ_t A_i, clip(ρ_t, 1−ε, 1+ε_high) A_i) + β kl_t) over this micro-batch, ρ_t the
    per-token ratio, is (B_mb, 1) or (B_mb, T) the importance-sampling weights (1 when π_θ sampled), as TRL applies
    them (not to the KL). Returns the loss, its policy part (without the KL term), and ρ (B_mb, T)."""
    ratio = torch.exp(logprobs - old_logprobs)  # ≡ 1 (with gradient ∇ log π) when old = logprobs.detach()
    A = advantages[:, None]
    surrogate = torch.min(ratio * A, ratio.clamp(1 - epsilon, 1 + epsilon_high) * A)
    policy_loss = -(surrogate * is_weights * weights).sum()
    if beta == 0:
        return policy_loss, policy_loss, ratio
    return policy_loss + beta * (per_token_kl(logprobs, ref_logprobs) * weights).sum(), policy_loss, ratio


def zero_std_groups(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """(P,) True for the groups whose rewards are all equal (or with fewer than two scorable): their advantages are 0,
    they carry no policy gradient."""
    return ~(common.nanstd(rewards.view(-1, num_generations), 1) > 1e-6)


def concat_samples(samples: list[dict], pad_token_id: int) -> dict:
    """Several generation rounds as one batch: lists joined, tensors concatenated, the (B, L) ones padded to the widest
    (prompts on the left, completions on the right; ids with pad_token_id, masks and log-probs with 0)."""

    def cat(key, values):
        if isinstance(values[0], list):
            return [v for value in values for v in value]
        width, fill = max(v.shape[-1] for v in values), pad_token_id if key.endswith("_ids") else 0
        side = lambda v: (width - v.shape[-1], 0) if key.startswith("prompt") else (0, width - v.shape[-1])
        return torch.cat([F.pad(v, side(v), value=fill) if v.dim() == 2 else v for v in values])

    return {key: cat(key, [s[key] for s in samples]) for key in samples[0]}


def select_groups(sample: dict, groups: list[int], num_generations: int) -> dict:
    """The completions of the given groups (prompt indices) of a sample."""
    rows = [g * num_generations + k for g in groups for k in range(num_generations)]
    return {key: [value[i] for i in rows] if isinstance(value, list) else value[rows] for key, value in sample.items()}


def dynamic_sampling(
    sample_round, num_prompts, num_generations, max_resample_rounds, pad_token_id, all_done=lambda done: done
):
    """DAPO's dynamic sampling: keep the groups whose rewards differ, from sample_round(0) (the step's own prompts),
    sample_round(1), ... until num_prompts groups are kept or max_resample_rounds extra rounds are spent; dropped groups
    fill whatever is missing. Returns the batch and the fraction of dropped groups. all_done(done) is True once every
    process is done, so that all run the same rounds (generation under ZeRO-3 or FSDP takes every process)."""
    kept, dropped, num_sampled = [], [], 0
    for round_index in range(1 + max_resample_rounds):
        sample = sample_round(round_index)
        zero_std = zero_std_groups(sample["rewards"], num_generations).tolist()
        num_sampled += len(zero_std)
        kept.append(select_groups(sample, [g for g, z in enumerate(zero_std) if not z], num_generations))
        dropped.append(select_groups(sample, [g for g, z in enumerate(zero_std) if z], num_generations))
        if all_done(sum(len(s["prompts"]) for s in kept) >= num_prompts * num_generations):
            break
    batch = concat_samples(kept + dropped, pad_token_id)
    batch = select_groups(batch, list(range(num_prompts)), num_generations)
    return batch, sum(len(s["prompts"]) for s in dropped) / (num_sampled * num_generations)


def main(args: Args):
    check_args(args)
    accelerator = common.make_accelerator(args)  # one process, or N under `accelerate launch`
    set_seed(args.seed, device_specific=True)  # seed + process index: each process samples its own completions
    device = accelerator.device
    G = args.num_generations
    # this process's prompts, its completions (whole groups of G) and the completions per forward and backward
    my_prompts, local_batch_size, micro_batch_size = common.process_share(accelerator, args, G)
    my_rows = slice(my_prompts.start * G, my_prompts.stop * G)  # this process's completions, in the whole batch
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
        accelerator, args, "grpo", model, tokenizer, scheduler, checkpoint, generation_config, reward_funcs, weights,
        eval_dataset,
    ) as run:  # fmt: skip
        for step in run.steps():
            logging_step = step % args.logging_steps == 0 or step == args.max_steps  # entropy then

            # ==== 1-2. rollout and score (rollout_and_score, above) ====
            rows = common.rows_of_step(train_dataset, step, args.prompts_per_step, args.seed, my_prompts)
            batch = rollout_and_score(rows)
            if args.dynamic_sampling:
                # Drop the groups whose rewards are all equal and draw more prompts at random, seeded by (seed, step,
                # round) so that a resumed run draws the same; each process refills its own share.
                def sample_round(round_index, batch=batch, step=step):
                    if round_index == 0:
                        return batch
                    generator = torch.Generator().manual_seed(hash((args.seed, step, round_index)) % 2**63)
                    drawn = torch.randperm(len(train_dataset), generator=generator)[: args.prompts_per_step]
                    return rollout_and_score(train_dataset.select(drawn[my_prompts].tolist()))

                all_done = lambda done: bool(accelerator.gather(torch.tensor([float(done)], device=device)).all())
                batch, dropped_frac = dynamic_sampling(
                    sample_round, local_batch_size // G, G, args.max_resample_rounds, tokenizer.pad_token_id, all_done
                )
                # every process ran the same rounds, so the mean of the fractions is the fraction
                dropped_frac = accelerator.reduce(torch.tensor(dropped_frac, device=device), "mean").item()
            completion_ids, completion_mask = batch["completion_ids"], batch["completion_mask"]  # (B, T)
            input_ids = torch.cat([batch["prompt_ids"], completion_ids], 1)
            attention_mask = torch.cat([batch["prompt_mask"], completion_mask], 1)
            T = completion_ids.shape[1]
            rewards = batch["rewards"].to(device)

            # ==== 3. advantage: group-relative, from the rewards only (the KL is a loss term) ====
            # Over the whole batch, gathered from every process, of which this process keeps its rows; and the token
            # weights, normalized over the whole batch (DDP averages the N processes' gradients: N × this share).
            all_rewards = accelerator.gather(rewards)  # (B,), in the order of the one-process batch
            advantages = group_relative_advantages(all_rewards, G, args.scale_rewards)[my_rows]
            loss_mask = completion_mask  # (B, T): the tokens that get a loss
            if args.mask_truncated_completions:  # DAPO's overlong filtering: none in a completion without EOS
                loss_mask = completion_mask * ~batch["is_truncated"][:, None]
            all_sum = lambda count: accelerator.reduce(count, "sum")
            token_weights = loss_token_weights(loss_mask, args.loss_type, args.max_completion_length, all_sum)
            token_weights = token_weights * accelerator.num_processes

            # ==== 4-6. per micro-batch: log-probs → per-token clipped surrogate + β·KL → loss; update ====
            # vLLM or the bf16 copy sampled, not π_θ: importance-sampling weights; else they stay 1
            off_policy = args.vllm_importance_sampling_correction and "sampler_logprobs" in batch
            is_weights = torch.ones(
                local_batch_size, T if args.vllm_importance_sampling_mode.startswith("token") else 1, device=device
            )
            old_logprobs, ref_logprobs, kl, entropy = torch.zeros(4, local_batch_size, T, device=device)
            clip_low, clip_high, losses, policy_losses, grad_norms = [], [], [], [], []
            micro_batches = torch.arange(local_batch_size, device=device).split(micro_batch_size)
            for iteration in range(args.num_iterations):
                loss_sum, policy_loss_sum = 0.0, 0.0
                entropy_now = logging_step and iteration == 0  # a diagnostic, logged from the first pass
                for mb in run.accumulate(micro_batches):  # gradients all-reduced once per update
                    # the reference pass first, so that its activations never coexist with the policy's
                    if iteration == 0 and args.beta > 0:
                        ref_logprobs[mb] = reference_logprobs(input_ids[mb], attention_mask[mb], T)
                    with accelerator.autocast():
                        logprobs, token_entropy = completion_logprobs(
                            model, input_ids[mb], attention_mask[mb], T, args.temperature, entropy=entropy_now
                        )
                    mask = completion_mask[mb]
                    if iteration == 0:
                        old_logprobs[mb] = logprobs.detach()  # π_θ_old: π_θ before this batch's first update
                        if off_policy:  # w = π_θ_old / π_sampler, capped or masked at C
                            is_weights[mb] = importance_sampling_weights(
                                old_logprobs[mb], batch["sampler_logprobs"][mb], mask,
                                mode=args.vllm_importance_sampling_mode, clip_max=args.vllm_importance_sampling_clip_max
                            )  # fmt: skip
                        entropy[mb] = token_entropy if entropy_now else 0.0
                        if args.beta > 0:
                            kl[mb] = per_token_kl(old_logprobs[mb], ref_logprobs[mb]) * mask
                    A = advantages[mb]
                    loss, policy_loss, ratio = grpo_loss(
                        logprobs, old_logprobs[mb], ref_logprobs[mb], A, token_weights[mb], is_weights[mb],
                        beta=args.beta, epsilon=args.epsilon, epsilon_high=epsilon_high
                    )  # fmt: skip
                    accelerator.backward(loss)
                    loss_sum += loss.item()
                    policy_loss_sum += policy_loss.item()
                    is_low = (ratio < 1 - args.epsilon) & (A[:, None] < 0)
                    is_high = (ratio > 1 + epsilon_high) & (A[:, None] > 0)
                    clip_low.append(((is_low * mask).sum() / mask.sum().clamp(min=1)).item())  # over the tokens
                    clip_high.append(((is_high * mask).sum() / mask.sum().clamp(min=1)).item())
                grad_norms.append(float(accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)))
                # before the update: a NaN reward marks an unscorable completion, anything else not finite stops here
                scorable = ~batch["rewards_per_func"].isnan().all(1)
                run.check_finite(reward=rewards[scorable], loss=loss_sum, grad_norm=grad_norms[-1])
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                losses.append(loss_sum)
                policy_losses.append(policy_loss_sum)
            run.reward_signal(not zero_std_groups(all_rewards, G).all())
            run.count_tokens(attention_mask)

            # ==== 7. log: statistics over the whole batch, from every process ====
            if logging_step:
                logged_kl = kl if args.beta > 0 else None  # β = 0: no reference, no KL
                metrics = common.rollout_metrics(accelerator, batch, rewards, reward_funcs, G, logged_kl, entropy)
                if args.dynamic_sampling:
                    metrics |= {"dynamic_sampling/dropped_frac": dropped_frac}
                # loss: each process logs N × its share of the batch loss; their mean is the batch loss
                metrics |= common.update_metrics(
                    accelerator, losses, grad_norms, clip_low, clip_high, policy_loss=policy_losses
                )
                if off_policy:
                    metrics |= common.sampling_metrics(
                        accelerator, old_logprobs, batch["sampler_logprobs"], is_weights, completion_mask
                    )
                run.log(step, metrics, (batch["prompts"], batch["completion_texts"], rewards))


if __name__ == "__main__":
    common.cli(main, Args)
