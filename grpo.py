"""GRPO: group relative policy optimization (Shao et al. 2024, "DeepSeekMath"), Dr. GRPO and DAPO.

For every prompt x, sample G = num_generations completions y_1..y_G from the policy π_θ at
temperature τ, and score them with a reward r (reward functions' weighted sum, or a reward model):

    Group-relative advantage (DeepSeekMath §4.1.2), the same for every token of y_i
        A_i = (r_i − mean_j r_j) / (std + 1e-4),    std: --scale_rewards group, batch or none (1)

    Per-token clipped surrogate, with the KL as a loss term (DeepSeekMath Eq. 3, k3 of Eq. 4)
        ρ_{i,t} = π_θ(y_{i,t} | x, y_{i,<t}) / π_θ_old(y_{i,t} | x, y_{i,<t})
        kl_{i,t} = ρ_{i,t} · (exp(log π_ref − log π_θ) − (log π_ref − log π_θ) − 1)
        ℓ_{i,t} = −is_{i,t} · min(ρ_{i,t} A_i, clip(ρ_{i,t}, 1 − ε, 1 + ε_high) A_i) + β · kl_{i,t}
        L(θ) = Σ_{i,t} w_{i,t} ℓ_{i,t} − c · H̄
    w by --loss_type, m_{i,t} = m_i on y_i's tokens, else 0:
            grpo        w_{i,t} = m_{i,t} / (|y_i| · N)    N: the completions with m_i = 1
            dr_grpo     w_{i,t} = m_{i,t} / (B · max_completion_length)
            dapo, bnpo  w_{i,t} = m_{i,t} / Σ_{j,s} m_{j,s}    (TRL's bnpo: by micro-batch)
    H̄: π_θ(· | x, y_{i,<t})'s entropy, m's mean; c: --entropy_coef (TRL's bonus; 0: off)
    ρ_{i,t} · k3: DeepSeek-V3.2's unbiased KL gradient (--use_bias_correction_kl, TRL's default)
    m_i = 0 for a completion without an end token under --mask_truncated_completions (else 1),
    and is_i TRL's importance-sampling correction when vLLM samples instead of π_θ (else 1):
        is_i = π_θ_old(y_i | x) / π_vllm(y_i | x), capped at C, or 0 above C (token_*: is_{i,t})

Dr. GRPO (Liu et al. 2025, §3.1–3.2): the std favours easy and hard prompts, |y_i| long wrong
answers: --scale_rewards none --loss_type dr_grpo. DAPO (Yu et al. 2025): clip-higher (§3.1,
--epsilon_high 0.28), dynamic sampling (§3.2, --dynamic_sampling: groups of equal rewards, A = 0,
give way to new prompts), the token-level loss (§3.3, dapo) and overlong filtering (§3.4, m_i).
GSPO (Zheng et al. 2025 §4.1; --importance_sampling_level sequence): ρ_{i,t} = s_i, the
exp of y_i's mean log(π_θ / π_θ_old), clipped as one; its objective with --loss_type grpo.
CISPO (MiniMax-M1 §3.1; --loss_type cispo): ℓ_{i,t} = −sg(min(ρ_{i,t}, ε_high)) A_i log π_θ.
INTELLECT-2 (--delta δ): min(ρ_{i,t}, δ) A_i in ℓ's min.

With num_iterations = 1 (the default) ρ ≡ 1 and ∇L = −Σ_{i,t} w_{i,t} A_i ∇ log π_θ(y_{i,t}) + the
KL term's. The logged `loss` and `policy_loss` (no c · H̄) sit near 0 when lengths are alike, as each
group's advantages sum to zero; `grad_norm` shows that the update does not. Worked example (G = 4,
--scale_rewards none): rewards 10, 8, 4, 2 have group mean 6 and advantages +4, +2, −2, −4,
which RLOO's leave-one-out advantages scale by G/(G−1) = 4/3.

Every normalizer counts the whole batch, of every process: micro-batches and processes give the
one-batch gradient (each process's loss is N times its share, as DDP averages the gradients).

    python grpo.py     # the embedded tiny model, offline, about two minutes
    accelerate launch --config_file configs/multi_gpu.yaml grpo.py --model_name_or_path ...

Copy grpo.py with common.py (text ↔ tokens) and rewards.py (reward functions); vllm_colocate.py
only for --use_vllm.
"""

import contextlib
import json
import math
import shutil
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import torch
import torch.utils.checkpoint
import yaml
from accelerate import Accelerator, DistributedType
from accelerate.tracking import get_available_trackers
from accelerate.utils import broadcast_object_list, gather_object, set_seed
from datasets import load_dataset
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, HfArgumentParser, get_scheduler

import common
from rewards import RewardError, check_columns, compute_rewards, load_reward_funcs, reward_weights

HERE = Path(__file__).resolve().parent
SCHEDULES = tuple(
    "linear cosine cosine_with_restarts polynomial constant constant_with_warmup inverse_sqrt".split()
)
IS_MODES = Literal["sequence_mask", "sequence_truncate", "token_mask", "token_truncate"]


def arg(default, help: str):
    """A flag's default and --help line; a list default is copied for each Args."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class Args:
    # model and data
    model_name_or_path: str = arg(str(HERE / "models/tiny-arith"), "policy: hub id or folder")
    attn_implementation: str | None = arg(None, "eager, sdpa, ... (default: transformers')")
    dataset_name: str = arg(str(HERE / "data/arithmetic"), "hub dataset, folder or file")
    dataset_config: str | None = arg(None, "the dataset's configuration, if it has several")
    dataset_train_split: str = arg("train", "split to train on")
    dataset_test_split: str = arg("test", "held-out split to evaluate (if absent: none)")
    reward_funcs: list[str] = arg(["accuracy"], "names, file.py:function or pkg.module.fn")
    reward_weights: list[str] = arg([], "one weight per reward function (default 1.0 each)")
    reward_model_path: str | None = arg(None, "a one-label sequence classifier, as a reward")
    # GRPO
    num_generations: int = arg(8, "completions per prompt, G ≥ 2: the baseline's group")
    scale_rewards: Literal["group", "batch", "none", "true", "false"] = arg(
        "group", "whose std divides A (above)"
    )
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo", "cispo"] = arg("dapo", "w, ℓ (above)")
    importance_sampling_level: Literal["token", "sequence"] = arg("token", "GSPO: sequence")
    beta: float = arg(0.0, "β of the k3 KL term; 0 loads no reference model")
    use_bias_correction_kl: bool = arg(True, "ρ · k3: the KL's unbiased gradient")
    entropy_coef: float = arg(0.0, "c, the entropy bonus's weight")
    num_iterations: int = arg(1, "optimizer steps on each batch")
    epsilon: float = arg(0.2, "lower clipping bound ε of the per-token ratio")
    epsilon_high: float | None = arg(None, "upper clipping bound (default: epsilon; cispo: ~5)")
    delta: float | None = arg(None, "INTELLECT-2's cap δ of ρ (above)")
    mask_truncated_completions: bool = arg(False, "no loss for completions with no end token")
    dynamic_sampling: bool = arg(False, "DAPO: groups of equal rewards give way to new prompts")
    max_resample_rounds: int = arg(3, "--dynamic_sampling: extra sampling rounds per step at most")
    # generation
    max_completion_length: int = arg(24, "tokens generated per completion at most")
    temperature: float = arg(1.0, "sampling temperature τ, also that of the log-probs")
    top_p: float = arg(1.0, "nucleus sampling (1.0: off; < 1 samples off-policy)")
    top_k: int = arg(0, "top-k sampling (0: off; > 0 samples off-policy)")
    chat_template_kwargs: dict | str | None = arg(None, "the chat template's arguments, as JSON")
    use_vllm: bool = arg(False, "sample with a colocated vLLM engine (needs a GPU)")
    vllm_gpu_memory_utilization: float = arg(0.3, "GPU memory share of the vLLM engine")
    vllm_max_model_length: int | None = arg(None, "vLLM's context length")
    vllm_importance_sampling_correction: bool = arg(True, "weight the loss by is_i")
    vllm_importance_sampling_mode: IS_MODES = arg("sequence_mask", "is_i or is_{i,t}, above")
    vllm_importance_sampling_clip_max: float = arg(3.0, "C, the cap of is_i")
    # optimization
    prompts_per_step: int = arg(8, "prompts per step, each with num_generations completions")
    micro_batch_size: int = arg(0, "completions per forward and backward (0: the batch)")
    max_steps: int = arg(100, "training steps, one batch each")
    learning_rate: float = arg(1e-4, "AdamW learning rate (~1e-6 for a 0.5B model)")
    lr_scheduler_type: Literal[SCHEDULES] = arg("cosine", "a schedule needing no kwargs or metric")
    warmup_ratio: float = arg(0.03, "fraction of the optimizer steps spent warming up")
    weight_decay: float = arg(0.0, "AdamW weight decay")
    max_grad_norm: float = arg(1.0, "gradient clipping norm (0: none)")
    seed: int = arg(0, "random seed (sampling, data order)")
    disable_dropout: bool = arg(True, "dropout off: sampling and the loss see one policy")
    # logging, evaluation, checkpoints
    output_dir: str = arg("outputs/grpo", "metrics.jsonl, checkpoints and the final model")
    overwrite_output_dir: bool = arg(False, "start over in an output_dir with another run")
    logging_steps: int = arg(5, "log metrics every this many steps")
    log_completions: bool = arg(False, "print a few completions at each log")
    num_completions_to_print: int = arg(2, "how many completions --log_completions prints")
    report_to: list[str] = arg(["none"], "trackers besides metrics.jsonl: wandb, all, ...")
    eval_strategy: Literal["steps", "no"] = arg("steps", "steps: at the start, end, eval_steps")
    eval_steps: int = arg(50, "evaluate every this many steps (0: start and end only)")
    num_generations_eval: int = arg(4, "samples per held-out prompt (and one greedy)")
    per_device_eval_batch_size: int = arg(512, "completions per generate call of evaluation")
    save_steps: int = arg(50, "checkpoint every this many steps (0: never; a stop saves)")
    save_total_limit: int | None = arg(None, "keep only the newest N checkpoints")
    resume_from_checkpoint: str | None = arg(None, "a checkpoint, or 'latest' in output_dir")
    # efficiency
    bf16: bool = arg(False, "bf16 autocast; master weights stay float32")
    gradient_checkpointing: bool = arg(False, "recompute activations in the backward pass")
    use_peft: bool = arg(False, "train a LoRA adapter; π_ref: the policy without it")
    lora_r: int = arg(16, "LoRA rank")
    lora_alpha: int = arg(32, "LoRA alpha")
    lora_dropout: float = arg(0.05, "LoRA dropout")
    lora_target_modules: list[str] = arg(["all-linear"], "modules LoRA adapts")
    load_in_4bit: bool = arg(False, "QLoRA: the frozen base in 4 bits; needs --use_peft")
    bnb_4bit_quant_type: Literal["nf4", "fp4"] = arg("nf4", "4-bit data type")


def check_args(args: Args):
    """This script's flags in range; then the ones every RL script shares."""
    if args.epsilon_high is None:  # TRL's default
        args.epsilon_high = args.epsilon
    booleans = {"true": "group", "false": "none"}
    args.scale_rewards = booleans.get(args.scale_rewards, args.scale_rewards)
    G = args.num_generations
    require(G >= 2, f"--num_generations: the baseline needs G ≥ 2, got {G}")
    rounds = args.max_resample_rounds
    require(rounds >= 0, f"--max_resample_rounds: must be ≥ 0, got {rounds}")
    if args.importance_sampling_level == "sequence" and args.loss_type != "grpo":  # as TRL
        tqdm.write(
            f"warning: --loss_type {args.loss_type} weighs each completion's s_i by its length; GSPO's is grpo",
            file=sys.stderr,
        )
    check_shared_args(args)


# ==== GRPO ====
def group_relative_advantages(rewards, num_generations: int, scale_rewards: str) -> torch.Tensor:
    """A_i (B,). An unscorable completion (r_i = NaN: no reward function applies) stays out of the
    means and stds, and gets A_i = 0, as does a group with one scorable (TRL's rule)."""
    grouped = rewards.view(-1, num_generations)
    advantages = grouped - grouped.nanmean(1, keepdim=True)
    if scale_rewards == "group":  # the scorable's sample std (n − 1), as TRL's nanstd
        scorable = grouped.isfinite().sum(1, keepdim=True)
        variance = advantages.pow(2).nansum(1, keepdim=True) / (scorable - 1)
        advantages = advantages / (variance.sqrt() + 1e-4)
    elif scale_rewards == "batch":
        advantages = advantages / (rewards[rewards.isfinite()].std() + 1e-4)
    return advantages.flatten().nan_to_num(0.0)


def per_token_kl(logprobs, ref_logprobs) -> torch.Tensor:
    """k3 = exp(−k1) + k1 − 1 of each sampled token, k1 = log π − log π_ref: unbiased and ≥ 0."""
    log_ratio = logprobs - ref_logprobs
    return torch.exp(-log_ratio) + log_ratio - 1


def importance_sampling_weights(
    old_logprobs, sampler_logprobs, completion_mask, *, mode: str, clip_max: float
):
    """is = π_θ_old / π_sampler of y_i (B, 1) or y_{i,t} (B, T), capped at clip_max or zeroed."""
    log_ratio = (old_logprobs - sampler_logprobs) * completion_mask
    if mode.startswith("sequence"):
        log_ratio = log_ratio.sum(1, keepdim=True)
    ratio = torch.exp(log_ratio)
    if mode.endswith("truncate"):
        return ratio.clamp(max=clip_max)
    return ratio.masked_fill(ratio > clip_max, 0.0)


def loss_normalizer(loss_mask, loss_type: str, max_completion_length: int) -> torch.Tensor:
    """Sequences (grpo) or tokens (dapo) with a loss in the rows, or B · max_completion_length."""
    if loss_type == "grpo":
        return (loss_mask.sum(1) > 0).sum()
    if loss_type == "dr_grpo":  # a constant, whatever the lengths
        return loss_mask.new_tensor(loss_mask.shape[0] * max_completion_length)
    return loss_mask.sum()


def loss_token_weights(loss_mask, loss_type: str, normalizer) -> torch.Tensor:
    """w (B, T): the loss mask over the whole batch's normalizer (grpo: each sequence's mean)."""
    if loss_type == "grpo":  # each sequence's token mean
        loss_mask = loss_mask / loss_mask.sum(1, keepdim=True).clamp(min=1)
    return loss_mask / normalizer.clamp(min=1)


def grpo_loss(
    logprobs,
    old_logprobs,
    ref_logprobs,
    advantages,
    weights,
    is_weights,
    mask=None,
    entropy=None,
    entropy_weights=None,
    *,
    beta,
    epsilon,
    epsilon_high,
    delta=None,
    loss_type="dapo",
    importance_sampling_level="token",
    use_bias_correction_kl=True,
    entropy_coef=0.0,
):
    """L of a micro-batch (above): is (B, 1) or (B, T), m and H (B, T), H's weights m / Σm;
    the loss, its policy part (no bonus) and ρ (B, T) or s (B, 1)."""
    log_ratio = logprobs - old_logprobs
    if importance_sampling_level == "sequence":  # GSPO: y_i's mean
        lengths = mask.sum(1, keepdim=True).clamp(min=1)
        log_ratio = (log_ratio * mask).sum(1, keepdim=True) / lengths
    ratio = torch.exp(log_ratio)  # ≡ 1 (but not its gradient) at the first update
    advantages = advantages[:, None]  # (B, 1): the same for every token
    if loss_type == "cispo":  # a constant weight of ∇ log π
        surrogate = ratio.clamp(max=epsilon_high).detach() * advantages * logprobs
    else:
        unclipped = ratio.clamp(max=math.inf if delta is None else delta)  # INTELLECT-2's δ
        clipped = ratio.clamp(1 - epsilon, 1 + epsilon_high)
        surrogate = torch.min(unclipped * advantages, clipped * advantages)
    loss = -(surrogate * is_weights * weights).sum()
    if beta > 0:
        kl = per_token_kl(logprobs, ref_logprobs)
        if use_bias_correction_kl:  # ∇(ρ · k3): the KL's, unbiased
            kl = ratio * kl
        loss = loss + beta * (kl * weights).sum()
    if entropy_coef == 0:
        return loss, loss, ratio
    bonus = entropy_coef * (entropy * entropy_weights).sum()
    return loss - bonus, loss, ratio


def zero_std_groups(rewards, num_generations: int) -> torch.Tensor:
    """(B / G,) True for a group whose scorable rewards are all equal (or under two): A = 0."""
    grouped = rewards.view(-1, num_generations)
    group_var = (grouped - grouped.nanmean(1, keepdim=True)).pow(2).nanmean(1)
    return group_var.nan_to_num(0.0) <= 1e-12  # NaN: a group with none scorable


def dynamic_sampling(rounds: list[dict], num_prompts: int, num_generations: int, pad_token_id):
    """DAPO's dynamic sampling: num_prompts groups of the rounds, those whose rewards differ first,
    in the rounds' order; and the fraction of the rounds' groups whose rewards were all equal."""
    rewards = torch.cat([sample["rewards"] for sample in rounds])
    zero_std = zero_std_groups(rewards, num_generations)
    differing_first = torch.cat([(~zero_std).nonzero(), zero_std.nonzero()])[:, 0]
    groups = differing_first[:num_prompts].sort().values
    rows = [i * num_generations + k for i in groups.tolist() for k in range(num_generations)]
    batch = {}
    for key in rounds[0]:
        joined = [row for sample in rounds for row in sample[key]]  # the rounds' rows, in order
        if isinstance(joined[0], str):
            batch[key] = [joined[i] for i in rows]
        elif joined[0].dim() == 0:  # (B,)
            batch[key] = torch.stack(joined)[rows]
        else:  # (B, L), padded to the widest round: the prompts on the left, as sampled
            fill = pad_token_id if key.endswith("_ids") else 0
            side = "left" if key.startswith("prompt") else "right"
            padded = torch.nn.utils.rnn.pad_sequence(
                joined, batch_first=True, padding_value=fill, padding_side=side
            )
            batch[key] = padded[rows]
    return batch, zero_std.float().mean()


def another_round(rounds: list[dict], args, accelerator) -> bool:
    """DAPO's dynamic sampling: another round of phases 1 and 2 while a process has fewer groups of
    differing rewards than prompts, at most --max_resample_rounds more; every process agrees."""
    if len(rounds) > args.max_resample_rounds:
        return False
    sampled = torch.cat([sample["rewards"] for sample in rounds])
    num_prompts = args.prompts_per_step // accelerator.num_processes  # this process's
    enough = (~zero_std_groups(sampled, args.num_generations)).sum() >= num_prompts
    # all processes sample as many rounds: ZeRO-3 or FSDP generation takes all
    return not accelerator.gather(enough.float()).all()


# ---- the log-probs at the temperature, which every equation above reads ----
def completion_logprobs(model, input_ids, attention_mask, T, temperature, entropy=False):
    """log π(y_t | x, y_<t) (B, T) of the last T tokens (the completion) under softmax(logits / τ),
    and with `entropy` its entropy (B, T), detached unless "grad"."""
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # as in generation
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    # the last T + 1 positions, the first predicting the first completion token (indices: faster)
    kept = torch.arange(input_ids.shape[1] - T - 1, input_ids.shape[1], device=input_ids.device)
    logits = model(**inputs, logits_to_keep=kept, use_cache=False).logits[:, :-1]  # (B, T, V)
    return log_softmax_and_gather(logits, input_ids[:, -T:], temperature, entropy)


def log_softmax_and_gather(logits, tokens, temperature: float, entropy=False, chunk=2**24):
    """log softmax(logits / τ) at `tokens` (B, T), and the entropy −Σ p log p, in pieces that the
    backward recomputes: the float32 (B, T, V) log-softmax is never whole (docs/benchmarks.md)."""
    positions = max(1, chunk // (logits.shape[0] * logits.shape[2]))

    def piece(z, y):
        logp = torch.log_softmax(z.float() / temperature, -1)
        chosen = logp.gather(-1, y[..., None])[..., 0]
        with torch.set_grad_enabled(entropy == "grad"):  # H = −Σ p log p, as TRL
            H = -(logp.exp() * logp).sum(-1) if entropy else None
        return chosen, H

    pieces = []  # (log-probs, entropies), each (B, positions)
    for z, y in zip(logits.split(positions, 1), tokens.split(positions, 1)):
        pieces.append(torch.utils.checkpoint.checkpoint(piece, z, y, use_reentrant=False))
    logprobs, entropies = zip(*pieces)
    return torch.cat(logprobs, 1), torch.cat(entropies, 1) if entropy else None


# ---- plumbing: the command line ----
class BadInput(Exception):
    """Bad input: one line, exit status 2, nothing written."""


def require(condition: bool, message: str):
    if not condition:
        raise BadInput(message)


@contextlib.contextmanager
def loading(flag: str, value, errors=(OSError, ValueError, ImportError, yaml.YAMLError)):
    """One line for bad input: a path, file, value or package that fails to load, a bad data row."""
    try:
        yield
    except errors as error:
        reason = (str(error).strip() or type(error).__name__).splitlines()[0]
        raise BadInput(f"{flag} {value}: {reason}") from None


def fail(message: str):
    tqdm.write(f"error: {message}", file=sys.stderr)  # below any progress bar
    sys.exit(2)


def parse_args(args_class):
    """The command line's flags, over a --config YAML file's (a TRL recipe, args.json)."""
    parser = HfArgumentParser(args_class, allow_abbrev=False)
    parser.add_argument("--config", help="a YAML file of flag: value, overridden by the flags")
    parser.error = lambda message: fail(message.replace("argument ", ""))  # no usage
    typed = []  # the config's flags; null and [] leave the default
    if path := parser.parse_args().config:
        with loading("--config", path):
            config = yaml.safe_load(Path(path).read_text()).items()
        for key, value in [(k, v) for k, v in config if v not in (None, [])]:
            values = value if isinstance(value, list) else [value]
            typed += [f"--{key}", *(v if isinstance(v, str) else json.dumps(v) for v in values)]
        parser.error = lambda message: fail(f"--config {path}: {message.replace('argument ', '')}")
    namespace = parser.parse_args(namespace=parser.parse_args(typed))
    del namespace.config
    if isinstance(template_kwargs := getattr(namespace, "chat_template_kwargs", None), str):
        with loading("--chat_template_kwargs", template_kwargs):
            namespace.chat_template_kwargs = json.loads(template_kwargs)
    return args_class(**vars(namespace))


# ---- plumbing: the flags every RL script shares ----
def check_shared_args(args):
    positive = (
        "max_steps prompts_per_step learning_rate max_completion_length temperature epsilon"
        " num_iterations logging_steps num_generations_eval per_device_eval_batch_size"
        " epsilon_high save_total_limit"
    )
    for name in positive.split():
        value = getattr(args, name)
        require(value is None or value > 0, f"--{name}: must be positive, got {value}")
    non_negative = "beta micro_batch_size top_k eval_steps save_steps weight_decay max_grad_norm"
    for name in non_negative.split():
        value = getattr(args, name)
        require(value >= 0, f"--{name}: must be ≥ 0, got {value}")
    require(0 < args.top_p <= 1, f"--top_p: must be in (0, 1], got {args.top_p}")
    require(0 <= args.warmup_ratio <= 1, f"--warmup_ratio: not in [0, 1]: {args.warmup_ratio}")
    require(0 <= args.seed < 2**32, f"--seed: must be in [0, 2**32), got {args.seed}")  # numpy's
    for name, default in asdict(type(args)()).items():
        if name.startswith(("lora_", "load_in")) and not args.use_peft:
            require(getattr(args, name) == default, f"--{name}: it needs --use_peft")
    require(not (args.use_vllm and args.load_in_4bit), "--load_in_4bit: not with --use_vllm")
    if args.dataset_train_split == args.dataset_test_split:
        raise BadInput("--dataset_test_split: the training split")


# ---- plumbing: data ----
def load_split(args, split: str):
    """A split of --dataset_name (hub dataset, folder, or file: its train split), or None."""
    is_train = split == args.dataset_train_split
    if not is_train and args.eval_strategy == "no":
        return None
    path = Path(args.dataset_name)
    if path.is_file() and path.stat().st_size == 0:
        raise BadInput(f"--dataset_name {path}: the file is empty")
    with loading("--dataset_name", args.dataset_name):
        if path.is_file():  # datasets reads the format from the extension
            splits = load_dataset(str(path.resolve().parent), data_files={"train": path.name})
        else:
            splits = load_dataset(args.dataset_name, args.dataset_config)
    flag = "--dataset_train_split" if is_train else "--dataset_test_split"
    optional = split == "test" and not is_train  # the default held-out split
    require(split in splits or optional, f"{flag}: no {split!r} in {sorted(splits)}")
    return splits.get(split)


# ---- plumbing: prompts ----
def prompt_texts(tokenizer, dataset, args, split: str) -> list[str]:
    """Every prompt of a split as the model reads it; an unrenderable row is named."""
    columns = dataset.column_names
    require("prompt" in columns, f"--dataset_name: the {split} split has no 'prompt' column")
    texts = []
    for row, prompt in enumerate(dataset["prompt"]):
        with loading("--dataset_name", f"row {row} of the {split} split", Exception):
            texts.append(common.prompt_text(tokenizer, prompt, args.chat_template_kwargs))
    return texts


def check_context(model, tokenizer, texts: list[str], length: int):
    """The longest prompt and --max_completion_length tokens fit the model's context."""
    longest = max(len(ids) for ids in tokenizer(texts, add_special_tokens=False).input_ids)
    room = getattr(model.config, "max_position_embeddings", math.inf) - longest
    if length > room:
        raise BadInput(
            f"--max_completion_length {length}: {room} fit the context after a {longest}-token prompt"
        )


# ---- plumbing: models ----
def load_for_training(args, path: str, model_class=AutoModelForCausalLM, **options):
    """A model to train: float32, dropout off (a frozen LoRA base: bf16 or 4-bit)."""
    from peft import LoraConfig, get_peft_model

    task_type = options.pop("task_type", "CAUSAL_LM")
    flag = options.pop("flag", "--model_name_or_path")
    four_bit = None
    if args.load_in_4bit:
        four_bit = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=args.bnb_4bit_quant_type,
            bnb_4bit_compute_dtype=torch.bfloat16 if args.bf16 else torch.float32,
        )
    dtype = torch.bfloat16 if args.use_peft and args.bf16 else torch.float32
    options.setdefault("attn_implementation", args.attn_implementation)
    with loading(flag, path):
        model = model_class.from_pretrained(
            path, dtype=dtype, quantization_config=four_bit, **options
        )
    if args.use_peft:
        modules = args.lora_target_modules
        targets = "all-linear" if modules == ["all-linear"] else modules  # peft's shorthand
        lora = LoraConfig(
            task_type=task_type,
            r=args.lora_r,
            lora_alpha=args.lora_alpha,
            lora_dropout=args.lora_dropout,
            target_modules=targets,
        )
        with loading("--lora_target_modules", targets):
            model = get_peft_model(model, lora)
        for param in model.parameters():
            if param.requires_grad:  # what trains is float32 (a score head too)
                param.data = param.data.float()
    if args.disable_dropout:
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):  # TRL's disable_dropout_in_model
                module.p = 0.0
            for name in ("dropout", "attention_dropout", "activation_dropout"):  # float rates
                if isinstance(getattr(module, name, None), float):  # OPT's, Llama's
                    setattr(module, name, 0.0)
    # bitsandbytes' CPU repacking at no-grad passes would break the training passes: turned off
    for layer in model.modules():
        if getattr(layer, "support_avx512bf16_for_cpu", False):
            layer.support_avx512bf16_for_cpu = False
    if args.gradient_checkpointing:
        getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
    return model.train()


# ---- plumbing: frozen models ----
def prepare_frozen(accelerator, model):
    """A frozen model (π_ref, a reward model) on its device; under ZeRO-3 in an engine, as TRL."""
    model = model.eval().requires_grad_(False)
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None or plugin.zero_stage != 3:
        return model.to(accelerator.device)
    import deepspeed

    config = plugin.deepspeed_config
    zero = {k: v for k, v in config["zero_optimization"].items() if v != "auto"}
    engine = deepspeed.initialize(model=model, config={**config, "zero_optimization": zero})[0]
    engine.eval()  # returns None, unlike a module's
    return engine


# ---- plumbing: sampling ----
@contextlib.contextmanager
def unwrapped_for_generation(accelerator, model):
    """The plain policy in eval mode, to sample from; its parameters gathered under ZeRO-3."""
    plugin = accelerator.state.deepspeed_plugin
    policy = accelerator.unwrap_model(model)
    gathered = contextlib.nullcontext()
    if plugin is not None and plugin.zero_stage == 3:
        import deepspeed

        gathered = deepspeed.zero.GatheredParameters(list(model.parameters()))
    with gathered, accelerator.autocast():
        yield policy.eval()  # in train mode, checkpointing turns generate's cache off
    policy.train()


# ---- plumbing: evaluation ----
@torch.no_grad()
def evaluate(accelerator, model, tokenizer, eval_dataset, eval_texts, reward_funcs, weights, args):
    """eval/reward, eval/<function>: means of num_generations_eval samples and a greedy one."""
    if eval_dataset is None:
        return {}
    my_rows = range(accelerator.process_index, len(eval_dataset), accelerator.num_processes)
    names = ["reward", *(name.removesuffix("_reward") for name in reward_funcs)]
    metrics = {}
    with torch.random.fork_rng(), unwrapped_for_generation(accelerator, model) as policy:
        torch.manual_seed(args.seed)
        for suffix, n, greedy in (("", args.num_generations_eval, False), ("_greedy", 1, True)):
            config = common.sampling_config(policy, tokenizer, args, greedy=greedy)
            rows_per_call = max(1, args.per_device_eval_batch_size // n)
            scores = []
            for start in range(0, len(my_rows), rows_per_call):
                indices = [i for i in my_rows[start : start + rows_per_call] for _ in range(n)]
                columns = eval_dataset.select(indices).to_dict()  # each row n times
                texts = [eval_texts[i] for i in indices]
                out = common.generate(policy, tokenizer, texts, config)
                mask, _ = common.end_of_completion(out["completion_ids"], config.eos_token_id)
                completions, ids = common.decode(tokenizer, out["completion_ids"], mask)
                prompts = columns.pop("prompt")
                rewards, per_func = compute_rewards(
                    reward_funcs, weights, prompts, completions, ids, columns
                )
                scores += torch.cat([rewards[:, None], per_func], 1).tolist()
            means = torch.tensor(gather_object(scores)).nanmean(0)  # over every process
            metrics |= {f"eval/{name}{suffix}": m for name, m in zip(names, means.tolist())}
    return metrics


# ---- plumbing: the output folder, checkpoints and logging ----
def claim_output_dir(args) -> Path | None:
    """The checkpoint to resume from, its later metrics dropped; None for a fresh folder."""
    out = Path(args.output_dir)
    metrics = out / "metrics.jsonl"
    require(args.output_dir, "--output_dir '': the working folder; name one")
    for flag, value in asdict(args).items():
        own = flag in ("output_dir", "resume_from_checkpoint")
        read = not own and Path(str(value)).exists()
        inside = read and value and Path(value).resolve().is_relative_to(out.resolve())
        require(not inside, f"--output_dir {out}: it holds --{flag} {value}")
    checkpoint = Path(args.resume_from_checkpoint) if args.resume_from_checkpoint else None
    if args.resume_from_checkpoint == "latest":
        found = checkpoints(out)
        require(found, f"--resume_from_checkpoint: none in {out}")
        checkpoint = found[-1]
    if checkpoint is not None:
        with loading("--resume_from_checkpoint", checkpoint):
            saved = json.loads((checkpoint / "args.json").read_text())
        if not (checkpoint / "state").is_dir():
            raise BadInput(f"--resume_from_checkpoint {checkpoint}: a run's final model")
        if not set(saved) <= set(asdict(args)):
            raise BadInput(f"--resume_from_checkpoint {checkpoint}: another script's checkpoint")
        skip = {"resume_from_checkpoint", "overwrite_output_dir"}
        changed = [k for k, v in asdict(args).items() if k not in skip and saved.get(k, v) != v]
        for key in ("learning_rate", "weight_decay", "lr_scheduler_type", "warmup_ratio"):
            require(key not in changed, f"--{key} {getattr(args, key)}: resumes keep {saved[key]}")
        changes = [f"--{k} {getattr(args, k)} (was {saved[k]})" for k in changed]
        print("; ".join([f"resuming from {checkpoint}", *changes]))
    with loading("--output_dir", out):
        out.mkdir(parents=True, exist_ok=True)
    if checkpoint is not None:
        step = json.loads((checkpoint / "trainer_state.json").read_text())["step"]
        if metrics.is_file():  # the log up to the checkpoint's step
            records = metrics.read_text().splitlines(keepends=True)
            metrics.write_text("".join(r for r in records if json.loads(r)["step"] <= step))
        return checkpoint
    used = [*checkpoints(out), *out.glob("metrics.jsonl")]
    if used and not args.overwrite_output_dir:
        raise BadInput(
            f"--output_dir: {out} holds a run: resume it (--resume_from_checkpoint latest) or --overwrite_output_dir"
        )
    for folder in checkpoints(out):  # --overwrite_output_dir
        shutil.rmtree(folder)
    metrics.unlink(missing_ok=True)
    return None


def checkpoints(output_dir) -> list[Path]:
    found = Path(output_dir).glob("checkpoint-*")
    return sorted(found, key=lambda path: int(path.name.split("-")[1]))


def save_model(accelerator, args, model, tokenizer, folder: Path, state: dict):
    """The model (or adapter), the tokenizer, trainer_state.json and args.json."""
    weights = accelerator.get_state_dict(model)  # every process: gathers sharded weights
    if accelerator.is_main_process:
        accelerator.unwrap_model(model).save_pretrained(folder, state_dict=weights)
        tokenizer.save_pretrained(folder)
        (folder / "trainer_state.json").write_text(json.dumps(state))
        flags = asdict(args) | {"resume_from_checkpoint": None}
        (folder / "args.json").write_text(json.dumps(flags, indent=2))


def save_checkpoint(accelerator, args, model, tokenizer, state: dict) -> Path:
    """checkpoint-{step}: `save_model` and accelerate's state/, renamed when complete."""
    folder = Path(args.output_dir) / f"checkpoint-{state['step']}"
    tmp = folder.with_name(f".{folder.name}.tmp")
    save_model(accelerator, args, model, tokenizer, tmp, state)
    # accelerate's hook: save_state writes no weights (saved above)
    hook = accelerator.register_save_state_pre_hook(lambda models, weights, _: weights.clear())
    accelerator.save_state(tmp / "state")
    hook.remove()
    accelerator.wait_for_everyone()  # every process has written its part of state/
    if accelerator.is_main_process:
        shutil.rmtree(folder, ignore_errors=True)  # a resume from before this step
        tmp.rename(folder)
        if args.save_total_limit:
            for old in checkpoints(args.output_dir)[: -args.save_total_limit]:
                shutil.rmtree(old)
    accelerator.wait_for_everyone()
    return folder


def load_checkpoint(accelerator, args, model, checkpoint: Path) -> dict:
    """Restore what `save_checkpoint` saved."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file, load_model

    unwrapped = accelerator.unwrap_model(model)
    # DeepSpeed and FSDP keep the weights in state/
    if accelerator.distributed_type not in (DistributedType.DEEPSPEED, DistributedType.FSDP):
        if hasattr(unwrapped, "peft_config"):
            adapter = checkpoint / "adapter_model.safetensors"
            set_peft_model_state_dict(unwrapped, load_file(adapter))
        else:
            load_model(unwrapped, checkpoint / "model.safetensors")
    # accelerate's hook: load_state reads no weights (loaded above)
    hook = accelerator.register_load_state_pre_hook(lambda models, _: models.clear())
    accelerator.load_state(checkpoint / "state")
    hook.remove()
    return json.loads((checkpoint / "trainer_state.json").read_text())


def log(accelerator, args, step: int, metrics: dict):
    if metrics and accelerator.is_main_process:
        with open(Path(args.output_dir) / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
    accelerator.log(metrics, step=step)


def main(args: Args):
    # ---- plumbing: setup ----
    check_args(args)
    known = {"none", "all", *map(str, get_available_trackers())}  # the trackers installed here
    require(set(args.report_to) <= known, f"--report_to {args.report_to}: not in {sorted(known)}")
    accelerator = Accelerator(
        mixed_precision="bf16" if args.bf16 else "no",
        log_with=None if args.report_to == ["none"] else args.report_to,
        project_dir=args.output_dir,
        step_scheduler_with_optimizer=False,  # one step an update, not one a process and update
    )
    if accelerator.state.deepspeed_plugin is not None:  # no DataLoader gives it the batch sizes
        accelerator.state.deepspeed_plugin.deepspeed_config.update(
            train_micro_batch_size_per_gpu=1,
            gradient_accumulation_steps=1,
            train_batch_size=accelerator.num_processes,
            gradient_clipping=args.max_grad_norm,
        )
    set_seed(args.seed, device_specific=True)  # seed + process index: each samples its own
    device = accelerator.device

    # ---- plumbing: each process's share of the prompts, in whole groups ----
    G = args.num_generations
    processes = accelerator.num_processes
    if args.prompts_per_step % processes != 0:
        raise BadInput(f"--prompts_per_step: not a multiple of the {processes} processes")
    local_prompts = args.prompts_per_step // processes
    first_prompt = accelerator.process_index * local_prompts
    my_prompts = slice(first_prompt, first_prompt + local_prompts)
    local_batch_size = local_prompts * G
    micro_batch_size = args.micro_batch_size or local_batch_size  # 0: the whole batch
    if local_batch_size % micro_batch_size != 0:
        raise BadInput(f"--micro_batch_size: must divide {local_batch_size} completions")

    # ---- plumbing: the splits and their prompts ----
    with loading("--model_name_or_path", args.model_name_or_path):
        tokenizer = common.load_tokenizer(args.model_name_or_path)
    train_dataset = load_split(args, args.dataset_train_split)
    eval_dataset = load_split(args, args.dataset_test_split)
    if len(train_dataset) < args.prompts_per_step:
        raise BadInput(f"--prompts_per_step: over the {len(train_dataset)} rows")
    train_texts = prompt_texts(tokenizer, train_dataset, args, args.dataset_train_split)
    eval_texts = []
    if eval_dataset is not None:
        eval_texts = prompt_texts(tokenizer, eval_dataset, args, args.dataset_test_split)

    # ---- plumbing: reward functions ----
    prepare = lambda model: prepare_frozen(accelerator, model)
    reward_funcs = load_reward_funcs(args, device, prepare)
    weights = reward_weights(args.reward_weights, reward_funcs)
    check_columns(reward_funcs, train_dataset, args.dataset_train_split)
    check_columns(reward_funcs, eval_dataset, args.dataset_test_split)

    # ---- plumbing: the policy π_θ, the reference π_ref (β > 0; LoRA: π_θ, adapter off) ----
    model = load_for_training(args, args.model_name_or_path)
    check_context(model, tokenizer, train_texts + eval_texts, args.max_completion_length)
    ref_model = None
    if args.beta > 0 and not args.use_peft:
        ref_model = AutoModelForCausalLM.from_pretrained(
            args.model_name_or_path,
            dtype=torch.bfloat16 if args.bf16 else torch.float32,  # frozen
            attn_implementation=args.attn_implementation,
        )
        ref_model = prepare_frozen(accelerator, ref_model)
    generation_config = common.sampling_config(model, tokenizer, args)
    end_ids = generation_config.eos_token_id

    # ---- plumbing: optimizer, scheduler, processes ----
    total_updates = args.max_steps * args.num_iterations
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        trained, args.learning_rate, weight_decay=args.weight_decay, fused=True
    )
    warmup = int(args.warmup_ratio * total_updates)
    scheduler = get_scheduler(args.lr_scheduler_type, optimizer, warmup, total_updates)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    accelerator.unwrap_model(model, keep_fp32_wrapper=False)  # --bf16: the logits stay bf16

    # ---- plumbing: resume, the first evaluation, the loop's stop ----
    # the main process alone claims the folder; every process resumes
    claimed = [claim_output_dir(args) if accelerator.is_main_process else None]
    checkpoint = broadcast_object_list(claimed)[0]
    fresh = {"step": 0, "num_tokens": 0}
    state = load_checkpoint(accelerator, args, model, checkpoint) if checkpoint else fresh
    vllm = None
    if args.use_vllm:  # sent the weights at every update
        with loading("--use_vllm", args.use_vllm):  # vllm not installed
            from vllm_colocate import VLLMGenerator
        vllm = VLLMGenerator(accelerator, args, tokenizer, model, end_ids)
    accelerator.init_trackers("huggingface", {k: str(v) for k, v in asdict(args).items()})

    evaluation = lambda: evaluate(
        accelerator, model, tokenizer, eval_dataset, eval_texts, reward_funcs, weights, args
    )
    first_eval = evaluation() if state["step"] == 0 else {}
    log(accelerator, args, 0, first_eval)
    # Ctrl-C, or SIGTERM from a scheduler: the loop ends after its step, with a checkpoint
    received_signals = []
    on_signal = lambda signum, frame: received_signals.append(signum)
    handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    steps = range(state["step"] + 1, args.max_steps + 1)
    hidden = not accelerator.is_main_process
    progress = tqdm(steps, initial=state["step"], total=args.max_steps, disable=hidden)

    def reference_logprobs(ids, mask, T):
        reference = ref_model if ref_model is not None else accelerator.unwrap_model(model)
        no_adapter = reference.disable_adapter() if args.use_peft else contextlib.nullcontext()
        with torch.no_grad(), accelerator.autocast(), no_adapter:
            logprobs, _ = completion_logprobs(reference, ids, mask, T, args.temperature)
        return logprobs

    for step in progress:
        step_start = time.perf_counter()
        logging_step = step % args.logging_steps == 0 or step == args.max_steps

        # ==== 1. rollout: G completions per prompt, each ended at its first end token ====
        # the step alone picks its prompts (a fresh permutation each epoch): a resume sees the same
        epoch, position = divmod(step - 1, len(train_dataset) // args.prompts_per_step)
        rounds = []  # phases 1 and 2, in rounds: one, or more under --dynamic_sampling (DAPO)
        while not rounds or args.dynamic_sampling and another_round(rounds, args, accelerator):
            if rounds:  # a permutation of its own (a tuple of ints hashes alike in every run)
                epoch = hash((step, len(rounds))) % 2**62
                position = 0
            seeded = torch.Generator().manual_seed(args.seed + epoch)
            order = torch.randperm(len(train_dataset), generator=seeded)
            start = position * args.prompts_per_step
            indices = order[start : start + args.prompts_per_step][my_prompts].tolist()
            indices = [i for i in indices for _ in range(G)]  # G in a row
            texts = [train_texts[i] for i in indices]
            if vllm is not None:
                rollout = vllm.generate(texts, device)
            else:
                with unwrapped_for_generation(accelerator, model) as policy:
                    rollout = common.generate(policy, tokenizer, texts, generation_config)
            completion_ids = rollout["completion_ids"]
            completion_mask, is_truncated = common.end_of_completion(completion_ids, end_ids)
            completion_ids = completion_ids.masked_fill(
                completion_mask == 0, tokenizer.pad_token_id
            )

            # ==== 2. score: r(x, y_i), the weighted sum of the reward functions ====
            completions, id_lists = common.decode(tokenizer, completion_ids, completion_mask)
            columns = train_dataset.select(indices).to_dict()
            prompts = columns.pop("prompt")
            rewards, rewards_per_func = compute_rewards(
                reward_funcs, weights, prompts, completions, id_lists, columns
            )
            rewards = rewards.to(device)  # (B,)
            rewards_per_func = rewards_per_func.to(device)  # (B, number of functions)
            rollout |= dict(texts=texts, completions=completions, rewards=rewards)
            rollout |= dict(rewards_per_func=rewards_per_func, is_truncated=is_truncated)
            rollout |= dict(completion_ids=completion_ids, completion_mask=completion_mask)
            rounds.append(rollout)
        if args.dynamic_sampling:  # local_prompts groups, those whose rewards differ first
            pad_token_id = tokenizer.pad_token_id
            rollout, dropped_frac = dynamic_sampling(rounds, local_prompts, G, pad_token_id)
            dropped_frac = accelerator.reduce(dropped_frac, "mean").item()
            texts, completions = rollout["texts"], rollout["completions"]
            rewards, rewards_per_func = rollout["rewards"], rollout["rewards_per_func"]
            completion_ids, completion_mask = rollout["completion_ids"], rollout["completion_mask"]
            is_truncated = rollout["is_truncated"]
        input_ids = torch.cat([rollout["prompt_ids"], completion_ids], 1)  # (B, P + T)
        attention_mask = torch.cat([rollout["prompt_mask"], completion_mask], 1)
        T = completion_ids.shape[1]

        # ==== 3. log-probs before any update: π_θ_old (the policy that sampled) and π_ref ====
        micro_batches = torch.arange(local_batch_size, device=device).split(micro_batch_size)
        keep_graph = len(micro_batches) == 1  # one micro-batch: the first update uses this graph
        old_logprobs = torch.zeros(local_batch_size, T, device=device)
        ref_logprobs = torch.zeros_like(old_logprobs) if args.beta > 0 else old_logprobs  # kl = 0
        entropy = torch.zeros(local_batch_size, T, device=device)
        bonus_entropy = "grad" if args.entropy_coef > 0 else False  # H, for the loss
        for mb in micro_batches:
            ids, mask = input_ids[mb], attention_mask[mb]
            if args.beta > 0:  # π_ref first, so that its memory is freed before the graph is kept
                ref_logprobs[mb] = reference_logprobs(ids, mask, T)
            with torch.set_grad_enabled(keep_graph), accelerator.autocast():
                logprobs, token_entropy = completion_logprobs(
                    model, ids, mask, T, args.temperature, entropy=bonus_entropy or logging_step
                )
            old_logprobs[mb] = logprobs.detach()  # π_θ_old = π_θ before the update
            if token_entropy is not None:
                entropy[mb] = token_entropy.detach()
        first_update = (logprobs, token_entropy) if keep_graph else None
        kl = per_token_kl(old_logprobs, ref_logprobs)  # (B, T), logged masked

        # ==== 4. advantages: group-relative, of the rewards alone (the KL is a loss term) ====
        all_rewards = accelerator.gather(rewards)  # (B,) of every process, as in one process
        local_rows = slice(my_prompts.start * G, my_prompts.stop * G)
        advantages = group_relative_advantages(all_rewards, G, args.scale_rewards)[local_rows]

        # ==== 5. weights: is_i when vLLM sampled, and w_{i,t}, normalized over every process ====
        off_policy = args.vllm_importance_sampling_correction and "sampler_logprobs" in rollout
        is_weights = torch.ones(local_batch_size, 1, device=device)
        if off_policy:  # vLLM sampled, not π_θ
            is_weights = importance_sampling_weights(
                old_logprobs,
                rollout["sampler_logprobs"],
                completion_mask,
                mode=args.vllm_importance_sampling_mode,
                clip_max=args.vllm_importance_sampling_clip_max,
            )
        in_loss = torch.ones(local_batch_size, device=device)  # m_i
        if args.mask_truncated_completions:
            in_loss = (~is_truncated).float()
        loss_mask = completion_mask * in_loss[:, None]  # m (B, T)
        normalizer = loss_normalizer(loss_mask, args.loss_type, args.max_completion_length)
        normalizer = accelerator.reduce(normalizer, "sum")  # counted in every process's rows
        # DDP averages the processes' gradients: N × this process's share of the one sum
        token_weights = processes * loss_token_weights(loss_mask, args.loss_type, normalizer)
        tokens_in_loss = accelerator.reduce(loss_mask.sum(), "sum")
        entropy_weights = processes * loss_token_weights(loss_mask, "dapo", tokens_in_loss)

        # ==== 6. loss and update: num_iterations passes over the batch, in micro-batches ====
        clip_low, clip_high, losses, policy_losses, grad_norms = [], [], [], [], []
        clip_high_at = args.epsilon_high if args.loss_type == "cispo" else 1 + args.epsilon_high
        for iteration in range(args.num_iterations):
            loss_sum = 0.0
            policy_loss_sum = 0.0
            for k, mb in enumerate(micro_batches):
                # DDP all-reduces the gradients, and DeepSpeed steps, at the last micro-batch alone
                last = k == len(micro_batches) - 1
                accelerator.sync_gradients = last
                with contextlib.nullcontext() if last else accelerator.no_sync(model):
                    if iteration == 0 and keep_graph:
                        logprobs, token_entropy = first_update  # phase 3's pass, graph and all
                    else:
                        ids, mask = input_ids[mb], attention_mask[mb]
                        with accelerator.autocast():
                            logprobs, token_entropy = completion_logprobs(
                                model, ids, mask, T, args.temperature, entropy=bonus_entropy
                            )
                    loss, policy_loss, ratio = grpo_loss(
                        logprobs,
                        old_logprobs[mb],
                        ref_logprobs[mb],
                        advantages[mb],
                        token_weights[mb],
                        is_weights[mb],
                        loss_mask[mb],
                        token_entropy,
                        entropy_weights[mb],
                        beta=args.beta,
                        epsilon=args.epsilon,
                        epsilon_high=args.epsilon_high,
                        delta=args.delta,
                        loss_type=args.loss_type,
                        importance_sampling_level=args.importance_sampling_level,
                        use_bias_correction_kl=args.use_bias_correction_kl,
                        entropy_coef=args.entropy_coef,
                    )
                    accelerator.backward(loss)
                loss_sum += loss.item()
                policy_loss_sum += policy_loss.item()
                share = completion_mask[mb] / completion_mask[mb].sum().clamp(min=1)  # of tokens
                if args.importance_sampling_level == "sequence":  # of completions, as TRL
                    share = torch.full_like(ratio, 1 / len(mb))
                clipped_low = (ratio < 1 - args.epsilon) & (advantages[mb, None] < 0)
                clipped_high = (ratio > clip_high_at) & (advantages[mb, None] > 0)
                clip_low.append((clipped_low * share).sum().item())
                clip_high.append((clipped_high * share).sum().item())
            max_norm = args.max_grad_norm or math.inf  # 0: no clipping, as in transformers
            grad_norms.append(float(accelerator.clip_grad_norm_(model.parameters(), max_norm)))
            if not (math.isfinite(loss_sum) and math.isfinite(grad_norms[-1])):
                progress.close()  # first: the error is then the log's last line
                fail(f"step {step}: the loss or the gradient norm is not finite; no update saved")
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss_sum)
            policy_losses.append(policy_loss_sum)

        # ==== 7. log: statistics over the whole batch, from every process (TRL's names) ====
        state["num_tokens"] += accelerator.reduce(attention_mask.sum(), "sum").item()
        if logging_step:
            all_lengths = accelerator.gather(completion_mask.sum(1).float())
            per_func = accelerator.gather(rewards_per_func)
            truncated = accelerator.gather(is_truncated).float()
            low = accelerator.gather(torch.tensor(clip_low, device=device))
            high = accelerator.gather(torch.tensor(clip_high, device=device))
            tokens = all_lengths.sum().clamp(min=1)
            kl_mean = accelerator.reduce((kl * completion_mask).sum(), "sum") / tokens
            entropy_mean = accelerator.reduce((entropy * completion_mask).sum(), "sum") / tokens
            zero_std = zero_std_groups(all_rewards, G)
            policy_loss = torch.tensor(policy_losses, device=device).mean()
            metrics = {
                "reward": all_rewards.nanmean().item(),
                "reward_std": all_rewards[all_rewards.isfinite()].std().item(),
                "frac_reward_zero_std": zero_std.float().mean().item(),
            }
            for j, name in enumerate(reward_funcs):
                metrics[f"rewards/{name}/mean"] = per_func[:, j].nanmean().item()
            metrics["completions/mean_length"] = all_lengths.mean().item()
            metrics["completions/clipped_ratio"] = truncated.mean().item()
            if args.beta > 0:
                metrics["kl"] = kl_mean.item()
            metrics["entropy"] = entropy_mean.item()
            mean_loss = accelerator.reduce(torch.tensor(losses, device=device).mean(), "mean")
            metrics["loss"] = mean_loss.item()
            metrics["policy_loss"] = accelerator.reduce(policy_loss, "mean").item()
            metrics["grad_norm"] = sum(grad_norms) / len(grad_norms)
            if args.loss_type == "cispo":  # the share of tokens whose ρ it caps
                metrics["cispo_clip_ratio"] = high.mean().item()
            else:
                metrics["clip_ratio/low_mean"] = low.mean().item()
                metrics["clip_ratio/low_min"] = low.min().item()
                metrics["clip_ratio/high_mean"] = high.mean().item()
                metrics["clip_ratio/high_max"] = high.max().item()
                metrics["clip_ratio/region_mean"] = (low + high).mean().item()
            if args.dynamic_sampling:
                metrics["dynamic_sampling/dropped_frac"] = dropped_frac
            if off_policy:  # |log π_θ_old − log π_vllm| of completion tokens, and is
                gap = (old_logprobs - rollout["sampler_logprobs"]).abs()[completion_mask.bool()]
                is_values = is_weights.flatten()  # sequence_*: one per completion
                if is_weights.shape[1] > 1:  # token_*: one per completion token
                    is_values = is_weights[completion_mask.bool()]
                all_gaps = torch.tensor(gather_object(gap.tolist()))
                all_is = torch.tensor(gather_object(is_values.tolist()))
                metrics["sampling/sampling_logp_difference/mean"] = all_gaps.mean().item()
                metrics["sampling/sampling_logp_difference/max"] = all_gaps.max().item()
                metrics["sampling/importance_sampling_ratio/min"] = all_is.min().item()
                metrics["sampling/importance_sampling_ratio/mean"] = all_is.mean().item()
                metrics["sampling/importance_sampling_ratio/max"] = all_is.max().item()

        # ---- plumbing: log, evaluate, save, stop ----
        state["step"] = step
        if logging_step:
            metrics["learning_rate"] = scheduler.get_last_lr()[0]
            metrics["num_tokens"] = state["num_tokens"]
            metrics["step_time"] = time.perf_counter() - step_start
            log(accelerator, args, step, metrics)
            progress.set_postfix(reward=f"{metrics['reward']:.3f}")
            if args.log_completions and accelerator.is_main_process:
                printed = list(zip(texts, completions, rewards.tolist()))
                for text, completion, reward in printed[: args.num_completions_to_print]:
                    tqdm.write(f"[step {step}] {text!r} → {completion!r}  reward {reward:.3f}")
        if vllm is not None:  # the next step samples from the updated policy
            vllm.sync_weights(accelerator, model)
        if args.eval_steps and step % args.eval_steps == 0 and step < args.max_steps:
            log(accelerator, args, step, evaluation())
        signalled = torch.tensor(float(len(received_signals)), device=device)
        stopping = accelerator.reduce(signalled, "sum").item() > 0  # any process's signal
        if (args.save_steps and step % args.save_steps == 0) or stopping:
            folder = save_checkpoint(accelerator, args, model, tokenizer, state)
        if stopping:
            accelerator.print(
                f"interrupted at step {step}: saved {folder}; continue with --resume_from_checkpoint latest"
            )
            accelerator.end_training()
            signum = received_signals[0] if received_signals else signal.SIGTERM
            sys.exit(128 + signum)

    # ---- plumbing: the final model and evaluation ----
    for signum, handler in handlers.items():  # from here on, a signal stops at once
        signal.signal(signum, handler)
    save_model(accelerator, args, model, tokenizer, Path(args.output_dir), state)
    last_eval = evaluation()
    log(accelerator, args, args.max_steps, last_eval)
    if first_eval and last_eval:
        key = "eval/accuracy" if "eval/accuracy" in last_eval else "eval/reward"
        sampled = f"{first_eval[key]:.3f} → {last_eval[key]:.3f}"
        greedy = f"{first_eval[key + '_greedy']:.3f} → {last_eval[key + '_greedy']:.3f}"
        accelerator.print(f"held-out {key}: {sampled} sampled, {greedy} greedy")
    # The DDP wrapper holds the process group: freed after end_training, it hangs gloo's workers
    if torch.distributed.is_initialized():  # a single process has no process group
        model, optimizer, scheduler = accelerator.free_memory(model, optimizer, scheduler)
    accelerator.end_training()
    accelerator.print(f"saved the model to {args.output_dir}")


if __name__ == "__main__":
    try:
        main(parse_args(Args))
    except (BadInput, RewardError) as error:
        fail(str(error))
