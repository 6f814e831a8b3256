"""PPO: Proximal Policy Optimization for language models, token by token, with a learned value model (Schulman et al.
2017; as used for RLHF by Ziegler et al. 2019 and described in "Back to Basics", Ahmadian et al. 2024).

Four models: the policy π_θ (trained); a frozen reference π_ref (the initial policy; with LoRA, the policy with its
adapters disabled); a reward source r (reward functions as in rloo.py, or a reward model); a value model V_ψ (trained;
a scalar head read at every position). For every prompt x, sample one completion y = y_1..y_T at temperature τ
(--temperature) and score it. Each token y_t is an action taken in the state s_t = (x, y_<t). Then:

    KL-shaped per-token reward (Ziegler et al. Eq. 2, spread over the tokens)
        kl_t = log π_θ(y_t | s_t) − log π_ref(y_t | s_t)                                  (k1, the default)
        kl_t = exp(log π_ref − log π_θ) − (log π_ref − log π_θ) − 1                          (k3, --kl_estimator k3)
        (as a reward, k3 estimates the KL's value without bias but its policy gradient E[k3 · ∇log π] is not ∇KL;
         k1's is: ∇KL = E[k1 · ∇log π], since E[∇log π] = 0)
        r_t = −kl_coef · kl_t,   plus the score r(x, y) on the last real token (the stop token; TRL put it one past)
        r(x, y) −= missing_eos_penalty when y has no --stop_token (a truncated completion)

    GAE (Schulman et al. 2016, Eq. 16), with V = 0 past the last real token
        δ_t = r_t + γ V(s_{t+1}) − V(s_t)
        A_t = Σ_l (γλ)^l δ_{t+l},        returns R_t = A_t + V(s_t)
        advantages whitened over the real tokens of the batch: (A − mean) / std

    Clipped losses, masked means over the real tokens of a mini-batch; num_ppo_epochs passes over num_mini_batches
        ρ_t = π_θ(y_t | s_t) / π_θ_old(y_t | s_t)
        L_pg = max(−A_t ρ_t, −A_t clip(ρ_t, 1 − cliprange, 1 + cliprange))                 (PPO Eq. 7, as a loss)
        L_vf = 0.5 · max((V − R)², (clip(V, V_old − cliprange_value, V_old + cliprange_value) − R)²)
        L = L_pg + vf_coef · L_vf                                                 (PPO Eq. 9, no entropy bonus)

    Sampler correction, when vLLM or the --bf16 copy samples instead of π_θ (TRL's importance sampling): L_pg of y_t is
    multiplied by
        w = π_θ_old / π_sampler of y (sequence_*) or y_t (token_*); capped at C (*_truncate), 0 above C (*_mask)

Back to Basics' Vanilla PG is `--lam 1.0 --num_ppo_epochs 1 --num_mini_batches 1 --whiten_advantages False`
(γ = 1, the default): the δ_t telescope to A_t = Σ_{l≥0} r_{t+l} − V(s_t) = G_t − V(s_t), one update per batch makes
ρ ≡ 1 so no clip binds, and ∇L_pg = −1/N Σ_t (G_t − V(s_t)) ∇ log π_θ(y_t | s_t) over the batch's N real tokens.

--adaptive_kl (Ziegler et al. 2019; lm-human-preferences) adapts kl_coef after each step towards a sequence KL target:
    kl_coef ← kl_coef · (1 + clip(KL / kl_target − 1, −0.2, 0.2) · B / kl_horizon),   KL = mean_i Σ_t kl_{i,t}
(lm-human-preferences starts it at 0.15 with target 6 and horizon 10000; here --kl_coef is the start).

The value model V_ψ is a sequence-classification model (num_labels=1) whose scalar head is applied to the backbone's
hidden state at every position, not only at the last token: V(s_t) is read where the policy's logits for y_t are. It
starts from --value_model_path, else the reward model (as in the reference implementations; a LoRA one is merged),
else the policy's own backbone with a fresh, zero-initialized head (V ≡ 0 at the start). It must share the policy's
tokenizer. Policy and value model share one AdamW (two parameter groups) but are gradient-clipped separately, so the
value loss never shrinks the policy's step.

The advantages need every value and log-prob of the batch before the first loss (GAE runs from the last token back,
whitening spans the batch): each step spends one no-grad pass of the policy and value model. Under `accelerate launch`
(DDP only) each process trains on its share of the prompts; the whitening statistics, the losses' token count and the
adaptive KL are summed over every process, so an update is the one-process update of the same batch (tested).
Sampling draws from softmax(logits / τ), the log-probs' distribution; --top_k and --top_p make training off-policy.

Copy ppo.py with common.py (plumbing: arguments, data, processes, sampling, evaluation, checkpoints, logging)
and rewards.py (reward functions, reward-model scoring; it stands alone); vllm_colocate.py only for --use_vllm.

    python ppo.py                                          # the embedded tiny model, offline, ~30 s on a 2-core CPU
    python ppo.py --reward_model_path outputs/reward_model --reward_funcs none   # reward_model.py's model alone
"""

from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.utils.checkpoint
from accelerate.utils import set_seed

import common
from common import arg, require
from rewards import compute_rewards


@dataclass
class Args(common.Args):
    """This script's flags; the ones every algorithm script shares are in common.Args (`--help` lists all)."""

    value_model_path: str | None = arg(None, "initial value model; default: the reward model, else the policy")
    num_ppo_epochs: int = arg(4, "passes over each batch of completions")
    num_mini_batches: int = arg(1, "optimizer steps per pass: the batch is split into this many mini-batches")
    cliprange: float = arg(0.2, "clipping range ε of the per-token ratio ρ in the policy loss")
    vf_coef: float = arg(0.1, "weight of the value loss in the total loss")
    cliprange_value: float = arg(0.2, "clipping range of the value around the rollout's value in the value loss")
    gamma: float = arg(1.0, "discount γ")
    lam: float = arg(0.95, "GAE λ (1.0: Monte-Carlo returns minus the value baseline)")
    whiten_advantages: bool = arg(True, "whiten the advantages over the batch's real tokens (off for Vanilla PG)")
    whiten_rewards: bool = arg(False, "scale the per-token rewards to unit variance over the batch before GAE")
    kl_coef: float = arg(0.05, "KL coefficient in the per-token reward; 0 skips the reference model entirely")
    kl_estimator: str = arg("k1", "KL estimator in the reward: k1 or k3 (k3's gradient is not the KL's)")
    adaptive_kl: bool = arg(False, "adapt kl_coef towards --kl_target (Ziegler et al. 2019); --kl_coef is its start")
    kl_target: float = arg(6.0, "--adaptive_kl: target sequence KL in nats")
    kl_horizon: int = arg(10000, "--adaptive_kl: horizon in completions")
    stop_token: str = arg("eos", "the token that ends a completion: 'eos' (the checkpoint's) or one token's text")
    missing_eos_penalty: float | None = arg(None, "subtracted from the score of a completion without the stop token")
    # this script's defaults of common.Args' flags
    disable_dropout: bool = arg(True, "dropout off in the policy and value model, so the rollout and update agree")
    prompts_per_step: int = arg(16, "prompts per step, one completion each: the step's batch of completions")
    micro_batch_size: int = arg(0, "completions per forward/backward, gradients accumulated (0 = the whole mini-batch)")
    max_steps: int = 25
    learning_rate: float = arg(1e-4, "AdamW learning rate of the policy and the value model (~3e-6 for a 0.5B model)")
    max_grad_norm: float = arg(1.0, "gradient clipping norm, of the policy and of the value model separately")
    output_dir: str = arg("outputs/ppo", "metrics.jsonl, checkpoints and the final model (value model: value_model/)")
    save_steps: int = 10
    use_peft: bool = arg(False, "train LoRA adapters (policy and value model); the reference: adapters disabled")


def check_args(args: Args):
    common.check_shared_args(args)  # the flags every script shares: learning rate, steps, sampling, output_dir, ...
    require(not args.load_in_4bit, "--load_in_4bit: ppo.py trains a value model beside the policy; not with QLoRA")
    require(args.num_ppo_epochs >= 1, f"--num_ppo_epochs: must be ≥ 1, got {args.num_ppo_epochs}")
    for name in ("num_mini_batches", "cliprange", "cliprange_value", "kl_target", "kl_horizon"):
        require(getattr(args, name) > 0, f"--{name}: must be positive, got {getattr(args, name)}")
    require(args.vf_coef >= 0, f"--vf_coef: must be ≥ 0, got {args.vf_coef}")
    require(0 <= args.gamma <= 1, f"--gamma: must be in [0, 1], got {args.gamma}")
    require(0 <= args.lam <= 1, f"--lam: must be in [0, 1], got {args.lam}")
    require(args.kl_coef >= 0, f"--kl_coef: must be ≥ 0, got {args.kl_coef}")
    require(not args.adaptive_kl or args.kl_coef > 0, "--adaptive_kl: needs a positive --kl_coef to start from")


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


def stop_token_ids(tokenizer, stop_token: str, end_ids: list[int]) -> list[int]:
    """--stop_token as the ids a completion that has stopped ends with: 'eos' is any of the checkpoint's end ids
    (`end_ids`, the sampling config's); any other text must be exactly one token."""
    if stop_token == "eos":
        return end_ids
    ids = tokenizer.encode(stop_token, add_special_tokens=False)
    require(len(ids) == 1, f"--stop_token: {stop_token!r} is {len(ids)} tokens for this tokenizer, not one")
    return ids


def ends_with(completion_ids: torch.Tensor, completion_mask: torch.Tensor, token_ids: list[int]) -> torch.Tensor:
    """Whether each completion's last real token is one of `token_ids` (B,): False for a truncated completion, or one
    that ended at another end token (the checkpoint's when --stop_token is something else)."""
    last = (completion_mask.sum(1) - 1).clamp(min=0)
    last_token = completion_ids.gather(1, last[:, None]).squeeze(1)
    return torch.isin(last_token, torch.tensor(token_ids, device=last_token.device)) & (completion_mask.sum(1) > 0)


def completion_values(value_model, input_ids, attention_mask, T: int) -> torch.Tensor:
    """V(s_t) (B, T) for the state before each of the last T tokens: the scalar head on every position's hidden state
    (the model's own forward reads it at the last token only; under DDP that forward synchronizes the gradients)."""
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    output = value_model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, output_hidden_states=True
    )
    head = getattr(value_model, "module", value_model).score  # DDP keeps the model in .module; peft forwards the name
    return head(output.hidden_states[-1][:, -T - 1 : -1]).squeeze(-1).float()


def per_token_rewards(scores: torch.Tensor, kl: torch.Tensor, completion_mask: torch.Tensor, kl_coef: float):
    """r_t = −kl_coef · kl_t on every real token, plus the score on the last real token (the stop token). (B, T)"""
    rewards = -kl_coef * kl * completion_mask
    last = completion_mask.sum(1).long() - 1  # index of the last real token; every completion has at least one
    rewards[torch.arange(len(scores), device=scores.device), last] += scores
    return rewards


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, all_sum=lambda total: total):
    """(x − mean) / std over the real tokens only (std with Bessel's correction); padding stays 0. With
    shift_mean=False the mean is kept: only the scale changes. `all_sum` sums a tensor over the processes, so that the
    mean and the std are those of the whole batch, not of this process's share."""
    n = all_sum(mask.sum())
    mean = all_sum((values * mask).sum()) / n.clamp(min=1)
    variance = all_sum((((values - mean) ** 2) * mask).sum()) / (n - 1).clamp(min=1)
    whitened = (values - mean) * torch.rsqrt(variance + 1e-8)
    return (whitened if shift_mean else whitened + mean) * mask


def gae_advantages(rewards, values, completion_mask, *, gamma: float, lam: float):
    """A_t = Σ_l (γλ)^l δ_{t+l}, δ_t = r_t + γ V_{t+1} − V_t, with r = V = 0 past the last real token.
    Returns the advantages and the returns A + V, both (B, T) and 0 on padding."""
    rewards, values = rewards * completion_mask, values * completion_mask
    advantages = torch.zeros_like(rewards)
    next_advantage = next_value = 0.0
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_advantage = delta + gamma * lam * next_advantage
        advantages[:, t] = next_advantage
        next_value = values[:, t]
    advantages = advantages * completion_mask
    return advantages, advantages + values


def policy_loss(logprobs, old_logprobs, advantages, mask, cliprange: float, num_tokens, importance_weights=1.0):
    """Σ_t w_t max(−A_t ρ_t, −A_t clip(ρ_t, 1 ± ε)) / num_tokens over this micro-batch's real tokens (`mask`), with w
    the importance-sampling weights, (B_mb, 1) or (B_mb, T); num_tokens counts the whole mini-batch, so accumulating
    micro-batches gives the mini-batch mean. Returns the loss, ρ and where the clipped term is the larger (B_mb, T)."""
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - cliprange, 1 + cliprange)
    surrogate = torch.max(unclipped, clipped) * importance_weights
    return (surrogate * mask).sum() / num_tokens, ratio, clipped > unclipped


def value_loss(values, old_values, returns, mask, cliprange_value: float, num_tokens):
    """0.5 · Σ_t max((V − R)², (clip(V, V_old ± ε_v) − R)²) / num_tokens over this micro-batch's real tokens.
    Returns the loss and where the clipped term is the larger one (B_mb, T)."""
    clipped_values = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    unclipped_loss = (values - returns) ** 2
    clipped_loss = (clipped_values - returns) ** 2
    loss = 0.5 * (torch.max(unclipped_loss, clipped_loss) * mask).sum() / num_tokens
    return loss, clipped_loss > unclipped_loss


def adaptive_kl_coef(kl_coef: float, kl: float, *, kl_target: float, kl_horizon: int, batch_size: int) -> float:
    """Ziegler et al.'s proportional controller: kl_coef · (1 + clip(KL / target − 1, ±0.2) · B / horizon)."""
    error = min(max(kl / kl_target - 1, -0.2), 0.2)
    return kl_coef * (1 + error * batch_size / kl_horizon)


# the token means logged after each step, over every token of every update
TOKEN_STATS = (
    "policy/approxkl_avg", "policy/clipfrac_avg", "policy/entropy_avg", "val/clipfrac_avg", "val/ratio", "val/ratio_var"
)  # fmt: skip


def ppo_metrics(accelerator, batch: dict, kl_coef: float, token_sums, updates: dict, reward_funcs: dict) -> dict:
    """TRL's PPO statistics of a step, over every process: objective/* from the batch (with its scores, stopped, kl and
    old_logprobs), the reward functions', the completions', the means of TOKEN_STATS over every completion token of
    one pass (`token_sums`: this process's sums, per pass; the last one is E[ρ²]), and the mean of each of `updates`
    (name -> one value per update)."""
    mask = batch["completion_mask"]
    scores, stopped, lengths, kl, entropy, per_func = common.everywhere(
        accelerator, batch["scores"], batch["stopped"], mask.sum(1).float(), batch["kl"].sum(1),
        (-batch["old_logprobs"] * mask).sum(1), batch["rewards_per_func"],
    )  # fmt: skip
    token_means = dict(zip(TOKEN_STATS, (accelerator.reduce(token_sums, "sum") / lengths.sum()).tolist()))
    token_means["val/ratio_var"] -= token_means["val/ratio"] ** 2  # E[ρ²] − E[ρ]²
    return {
        "objective/scores": scores.nanmean().item(),
        "objective/rlhf_reward": (scores - kl_coef * kl).nanmean().item(),
        "objective/kl": kl.mean().item(),
        "objective/non_score_reward": (-kl_coef * kl).mean().item(),
        "objective/entropy": entropy.mean().item(),
        "objective/kl_coef": kl_coef,
        **common.reward_metrics(per_func, reward_funcs),
        **token_means,
        "val/num_eos_tokens": stopped.sum().item(),
        **common.completion_metrics(lengths, ~stopped),  # without the stop token: truncated
        **{name: common.everywhere(accelerator, torch.tensor(v)).mean().item() for name, v in updates.items()},
    }


def main(args: Args):
    check_args(args)
    accelerator = common.make_accelerator(args)  # one process, or N under `accelerate launch`
    set_seed(args.seed, device_specific=True)  # seed + process index: each process samples its own completions
    device = accelerator.device
    P = accelerator.num_processes
    G = 1  # one completion per prompt
    batch_size = args.prompts_per_step  # completions per step, over all processes
    # this process's prompts, its completions, and the completions per forward and backward of each mini-batch
    my_prompts, local_batch_size, micro_batch_size = common.process_share(accelerator, args, G, args.num_mini_batches)
    mini_batch_size = local_batch_size // args.num_mini_batches  # each process splits its share into num_mini_batches
    all_sum = lambda total: accelerator.reduce(total, "sum")  # a sum over every process's share of the batch
    everywhere = lambda x: accelerator.gather(x.to(device))  # (B_local, ...) -> (B, ...), every process's rows

    # ---- plumbing: data, policy π_θ, reference π_ref (only when kl_coef > 0), reward functions, value model V_ψ ----
    datasets = train_dataset, eval_dataset = common.load_data(accelerator, args)
    checkpoint = common.resolve_checkpoint(args.resume_from_checkpoint, args.output_dir, args)
    tokenizer, model, ref_model, generation_config = common.load_policy_and_reference(
        accelerator, args, datasets, args.kl_coef > 0
    )
    reward_funcs, weights = common.load_rewards(accelerator, args, datasets)
    value_model = common.load_value_model(args, tokenizer.pad_token_id)  # V_ψ: see the docstring
    stop_ids = stop_token_ids(tokenizer, args.stop_token, generation_config.eos_token_id)
    # a completion ends at the checkpoint's end tokens or the stop token
    generation_config.eos_token_id = sorted({*generation_config.eos_token_id, *stop_ids})
    total_updates = args.max_steps * args.num_ppo_epochs * args.num_mini_batches
    model, value_model, optimizer, scheduler = common.prepare_training(  # one AdamW, a parameter group each; DDP only
        accelerator, args, total_updates, model, value_model
    )
    value_params = [p for p in value_model.parameters() if p.requires_grad]
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
        accelerator, args, "ppo", model, tokenizer, scheduler, checkpoint, generation_config, reward_funcs, weights,
        eval_dataset, state={"kl_coef": args.kl_coef}, others={"value_model": value_model},
        postfix=("objective/scores", "objective/kl"),
    ) as run:  # fmt: skip
        for step in run.steps():
            logging_step = step % args.logging_steps == 0 or step == args.max_steps  # entropy then
            kl_coef = run.state["kl_coef"]  # --adaptive_kl changes it after each step

            # ==== 1-2. rollout and score (rollout_and_score, above) ====
            rows = common.rows_of_step(train_dataset, step, args.prompts_per_step, args.seed, my_prompts)
            batch = rollout_and_score(rows)
            completion_ids, completion_mask = batch["completion_ids"], batch["completion_mask"]  # (B, T)
            input_ids = torch.cat([batch["prompt_ids"], completion_ids], 1)
            attention_mask = torch.cat([batch["prompt_mask"], completion_mask], 1)
            T = completion_ids.shape[1]
            scores = batch["rewards"].to(device)  # r(x, y), on the last token below
            stopped = ends_with(completion_ids, completion_mask, stop_ids)  # the others get --missing_eos_penalty
            if args.missing_eos_penalty is not None:
                scores -= args.missing_eos_penalty * (~stopped).float()

            # ==== 3. log-probs, values and the KL, no gradient: π_θ_old, V_old, and kl_t to the reference ====
            old_logprobs, old_values, kl = torch.zeros(3, local_batch_size, T, device=device)
            with torch.no_grad():
                for mb in torch.arange(local_batch_size, device=device).split(micro_batch_size):
                    with accelerator.autocast():
                        old_logprobs[mb] = completion_logprobs(
                            model, input_ids[mb], attention_mask[mb], T, args.temperature
                        )[0]
                        old_values[mb] = completion_values(value_model, input_ids[mb], attention_mask[mb], T)
                    if args.kl_coef > 0:
                        ref_logprobs = reference_logprobs(input_ids[mb], attention_mask[mb], T)
                        kl[mb] = per_token_kl(old_logprobs[mb], ref_logprobs, args.kl_estimator) * completion_mask[mb]

            # vLLM or the bf16 copy sampled, not π_θ: importance-sampling weights; else they stay 1
            off_policy = args.vllm_importance_sampling_correction and "sampler_logprobs" in batch
            is_weights = torch.ones(
                local_batch_size, T if args.vllm_importance_sampling_mode.startswith("token") else 1, device=device
            )
            if off_policy:  # w = π_θ_old / π_sampler, capped or masked at C
                is_weights = importance_sampling_weights(
                    old_logprobs,
                    batch["sampler_logprobs"],
                    completion_mask,
                    mode=args.vllm_importance_sampling_mode,
                    clip_max=args.vllm_importance_sampling_clip_max,
                )

            # ==== 4-5. KL-shaped per-token rewards → GAE advantages and returns → whitened (over the whole batch) ====
            # An unscorable completion (no reward function applies: NaN score) gets no loss and stays out of whitening.
            loss_mask = completion_mask * ~scores.isnan()[:, None]
            rewards = per_token_rewards(scores.nan_to_num(0.0), kl, completion_mask, kl_coef)
            if args.whiten_rewards:
                rewards = masked_whiten(rewards, loss_mask, shift_mean=False, all_sum=all_sum)
            advantages, returns = gae_advantages(rewards, old_values, completion_mask, gamma=args.gamma, lam=args.lam)
            if args.whiten_advantages:
                advantages = masked_whiten(advantages, loss_mask, all_sum=all_sum)

            # ==== 6. loss and update: num_ppo_epochs passes over fresh mini-batches, clipped policy and value loss ====
            # The losses are token means over the mini-batch of every process together: DDP averages the P processes'
            # gradients, so each divides its token sum by the global token count over P.
            token_sums = torch.zeros(len(TOKEN_STATS), device=device)  # the logged token means' numerators
            policy_losses, value_losses, grad_norms, value_grad_norms = [], [], [], []
            for _epoch in range(args.num_ppo_epochs):
                for mini in torch.randperm(local_batch_size, device=device).split(mini_batch_size):
                    num_tokens = max(all_sum(loss_mask[mini].sum()).item(), 1) / P
                    policy_loss_sum = value_loss_sum = 0.0
                    # the policy's and the value model's gradients are all-reduced once, at the last micro-batch
                    for mb in run.accumulate(mini.split(micro_batch_size)):
                        with accelerator.autocast():
                            logprobs, token_entropy = completion_logprobs(
                                model, input_ids[mb], attention_mask[mb], T, args.temperature, entropy=logging_step
                            )
                            values = completion_values(value_model, input_ids[mb], attention_mask[mb], T)
                        mask = loss_mask[mb]
                        pg_loss, ratio, pg_clipped = policy_loss(
                            logprobs, old_logprobs[mb], advantages[mb], mask, args.cliprange, num_tokens, is_weights[mb]
                        )
                        vf_loss, vf_clipped = value_loss(
                            values, old_values[mb], returns[mb], mask, args.cliprange_value, num_tokens
                        )
                        accelerator.backward(pg_loss + args.vf_coef * vf_loss)
                        policy_loss_sum += pg_loss.item()
                        value_loss_sum += vf_loss.item()
                        if logging_step:  # the TOKEN_STATS, summed over the real tokens
                            approxkl = 0.5 * (logprobs - old_logprobs[mb]) ** 2
                            stats = (approxkl, pg_clipped, token_entropy, vf_clipped, ratio, ratio**2)
                            token_sums += torch.stack([(x.detach().float() * mask).sum() for x in stats])
                    policy_losses.append(policy_loss_sum)
                    value_losses.append(value_loss_sum)
                    grad_norms.append(float(accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)))
                    # that call unscaled the whole optimizer's gradients (fp16), the value model's too: clip them here
                    value_grad_norms.append(float(torch.nn.utils.clip_grad_norm_(value_params, args.max_grad_norm)))
                    # before the update: a NaN score marks an unscorable completion, anything else not finite stops
                    scorable = ~batch["rewards_per_func"].isnan().all(1)
                    run.check_finite(score=scores[scorable], policy_loss=policy_loss_sum, value_loss=value_loss_sum,
                                     grad_norm=grad_norms[-1], value_grad_norm=value_grad_norms[-1])  # fmt: skip
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad(set_to_none=True)
            all_scores = everywhere(scores)
            run.reward_signal(bool(all_scores[~all_scores.isnan()].std() > 1e-6))  # not all scored the same
            run.count_tokens(attention_mask)
            if args.adaptive_kl:  # towards the target sequence KL, mean_i Σ_t kl_{i,t} over the whole batch
                sequence_kl = everywhere(kl.sum(1)).mean().item()
                run.state["kl_coef"] = adaptive_kl_coef(
                    kl_coef, sequence_kl, kl_target=args.kl_target, kl_horizon=args.kl_horizon, batch_size=batch_size
                )

            # ==== 7. log: TRL's PPO statistics over the whole batch, from every process ====
            if logging_step:
                rollout = batch | dict(scores=scores, stopped=stopped, kl=kl, old_logprobs=old_logprobs)
                losses = {"loss/policy_avg": policy_losses, "loss/value_avg": value_losses}
                norms = {"grad_norm": grad_norms, "val/grad_norm": value_grad_norms}
                token_means = token_sums / args.num_ppo_epochs
                metrics = ppo_metrics(accelerator, rollout, kl_coef, token_means, losses | norms, reward_funcs)
                if off_policy:
                    metrics |= common.sampling_metrics(
                        accelerator, old_logprobs, batch["sampler_logprobs"], is_weights, completion_mask
                    )
                run.log(step, metrics, (batch["prompts"], batch["completion_texts"], scores))


if __name__ == "__main__":
    common.cli(main, Args)
