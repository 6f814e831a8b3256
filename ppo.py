"""PPO: proximal policy optimization (Schulman et al. 2017) for language models, token by token,
with a learned value model, as in RLHF (Ziegler et al. 2019) and TRL's PPOTrainer ("Back to
Basics", Ahmadian et al. 2024, §3).

Four models: the policy π_θ (trained); a frozen reference π_ref (the initial policy; with LoRA,
π_θ without its adapter); the reward r (reward functions, or a reward model); a value model V_ψ
(trained). For every prompt x, sample one completion y = y_1..y_T from π_θ at temperature τ and
score it; y_t is an action in the state s_t = (x, y_<t). Then:

    KL-shaped per-token reward (Ziegler et al. Eq. 2, spread over the tokens)
        kl_t = log π_θ(y_t | s_t) − log π_ref(y_t | s_t)               (k1, the default)
        kl_t = exp(log π_ref − log π_θ) − (log π_ref − log π_θ) − 1      (k3)
        r_t = −kl_coef · kl_t, plus the score on the last real token (TRL: one past it)
        score(x, y) = r(x, y) − missing_eos_penalty if y does not end with --stop_token

    Generalized advantage estimation (Schulman et al. 2016, Eq. 16), V = 0 past the last token
        δ_t = r_t + γ V(s_{t+1}) − V(s_t),    A_t = Σ_l (γλ)^l δ_{t+l},    R_t = A_t + V(s_t)
        then (--whiten_advantages) A ← (A − mean) / std over the batch's real tokens

    Clipped losses, token means over a mini-batch; num_ppo_epochs passes of num_mini_batches
        ρ_t = π_θ(y_t | s_t) / π_θ_old(y_t | s_t)
        L_pg = max(−A_t ρ_t, −A_t clip(ρ_t, 1 − ε, 1 + ε))        (PPO Eq. 7, ε = cliprange)
        L_vf = ½ max((V_ψ(s_t) − R_t)², (clip(V_ψ(s_t), V_old(s_t) ± ε_v) − R_t)²)
        L = L_pg + vf_coef · L_vf                   (PPO Eq. 9, ε_v = cliprange_value)
    with L_pg of y_t times TRL's importance-sampling weight when vLLM samples instead of π_θ:
        w = π_θ_old / π_vllm of y (sequence_*) or of y_t (token_*), capped at C or 0 above C

    Adaptive KL controller (--adaptive_kl; Ziegler et al. §2.2), KL = mean_i Σ_t kl_{i,t}
        kl_coef ← kl_coef · (1 + clip(KL / kl_target − 1, ±0.2) · prompts_per_step / kl_horizon)

Worked example (γ = 1, λ = 0.95): three tokens with rewards 0, 0, 1 and values 0.5, 0.6, 0.7
give δ = 0.1, 0.1, 0.3, advantages 0.46575, 0.385, 0.3 and returns 0.96575, 0.985, 1.0. Back to
Basics' Vanilla PG is `--lam 1 --num_ppo_epochs 1 --whiten_advantages False`: the δ_t telescope
to A_t = Σ_{l≥0} r_{t+l} − V(s_t), and one update per batch makes ρ ≡ 1.

V_ψ is a one-label sequence classifier, its head read where the policy's logits for y_t are. It
starts from --value_model_path, else the reward model, else the policy with a new head at zero
(V ≡ 0); a reward model with another tokenizer only scores. One AdamW updates both models, each
clipped on its own; checkpoints and the final model hold V_ψ in value_model/. GAE runs from the
last token back and whitening spans the batch, so a pass without gradients gives every
log π_θ_old, V_old and kl_t before the first loss. Under `accelerate launch` (DDP) the
whitening statistics, token counts and the controller's KL are the whole batch's.

    python ppo.py               # the embedded tiny model, offline, about 20 s on a CPU
    python ppo.py --reward_model_path outputs/reward_model --reward_funcs none

Copy ppo.py with common.py (text ↔ tokens) and rewards.py (reward functions); vllm_colocate.py
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
import transformers
import yaml
from accelerate import Accelerator, DistributedType
from accelerate.tracking import get_available_trackers
from accelerate.utils import broadcast_object_list, gather_object, set_seed
from datasets import load_dataset
from tqdm.auto import tqdm
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    BitsAndBytesConfig,
    HfArgumentParser,
    get_scheduler,
)

import common
from rewards import RewardError, check_columns, compute_rewards, load_reward_funcs, reward_weights

HERE = Path(__file__).resolve().parent
SCHEDULES = tuple(
    "linear cosine cosine_with_restarts polynomial constant constant_with_warmup inverse_sqrt".split()
)


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
    value_model_path: str | None = arg(None, "V_ψ's start (default: the reward model, else π_θ)")
    # PPO
    num_ppo_epochs: int = arg(4, "passes over each batch of completions")
    num_mini_batches: int = arg(1, "optimizer steps per pass, one per mini-batch")
    cliprange: float = arg(0.2, "clipping range ε of the per-token ratio ρ")
    vf_coef: float = arg(0.1, "weight of the value loss in the loss")
    cliprange_value: float = arg(0.2, "clipping range of V_ψ around V_old in the value loss")
    gamma: float = arg(1.0, "discount γ")
    lam: float = arg(0.95, "GAE λ (1.0: the return to go minus the value)")
    whiten_advantages: bool = arg(True, "whiten the advantages over the batch's real tokens")
    whiten_rewards: bool = arg(False, "scale the per-token rewards to unit variance before GAE")
    kl_coef: float = arg(0.05, "KL coefficient of the per-token reward; 0 loads no π_ref")
    kl_estimator: Literal["k1", "k3"] = arg("k1", "KL estimator in the reward")
    adaptive_kl: bool = arg(False, "adapt kl_coef towards --kl_target, from --kl_coef")
    kl_target: float = arg(6.0, "--adaptive_kl: the target KL of a completion, in nats")
    kl_horizon: int = arg(10000, "--adaptive_kl: the horizon, in completions")
    stop_token: str = arg("eos", "'eos' (the checkpoint's end ids), or one token's text")
    missing_eos_penalty: float | None = arg(None, "subtracted from the score without stop_token")
    # generation
    max_completion_length: int = arg(24, "tokens generated per completion at most")
    temperature: float = arg(1.0, "sampling temperature τ, also that of the log-probs")
    top_p: float = arg(1.0, "nucleus sampling (1.0: off; < 1 samples off-policy)")
    top_k: int = arg(0, "top-k sampling (0: off; > 0 samples off-policy)")
    chat_template_kwargs: dict | str | None = arg(None, "the chat template's arguments, as JSON")
    use_vllm: bool = arg(False, "sample with a colocated vLLM engine (needs a GPU)")
    vllm_gpu_memory_utilization: float = arg(0.3, "GPU memory share of the vLLM engine")
    vllm_max_model_length: int | None = arg(None, "vLLM's context length")
    vllm_importance_sampling_correction: bool = arg(True, "weight the policy loss by w")
    vllm_importance_sampling_mode: Literal[
        "sequence_mask", "sequence_truncate", "token_mask", "token_truncate"
    ] = arg("sequence_mask", "w of y or of each y_t; 0 above C, or C")
    vllm_importance_sampling_clip_max: float = arg(3.0, "C, the cap of w")
    # optimization
    prompts_per_step: int = arg(16, "prompts per step, one completion each")
    micro_batch_size: int = arg(0, "completions per forward and backward (0: the mini-batch)")
    max_steps: int = arg(25, "training steps, one batch each")
    learning_rate: float = arg(1e-4, "AdamW learning rate of both models (~3e-6 for 0.5B)")
    lr_scheduler_type: Literal[SCHEDULES] = arg("cosine", "a schedule needing no kwargs or metric")
    warmup_ratio: float = arg(0.03, "fraction of the optimizer steps spent warming up")
    weight_decay: float = arg(0.0, "AdamW weight decay")
    max_grad_norm: float = arg(1.0, "gradient clipping norm of each model (0: none)")
    seed: int = arg(0, "random seed (sampling, data order, mini-batches)")
    disable_dropout: bool = arg(True, "dropout off: sampling and the loss see one policy")
    # logging, evaluation, checkpoints
    output_dir: str = arg("outputs/ppo", "metrics.jsonl, checkpoints, the final model, V_ψ")
    overwrite_output_dir: bool = arg(False, "start over in an output_dir with another run")
    logging_steps: int = arg(5, "log metrics every this many steps")
    log_completions: bool = arg(False, "print a few completions at each log")
    num_completions_to_print: int = arg(2, "how many completions --log_completions prints")
    report_to: list[str] = arg(["none"], "trackers besides metrics.jsonl: wandb, all, ...")
    eval_strategy: Literal["steps", "no"] = arg("steps", "steps: at the start, end, eval_steps")
    eval_steps: int = arg(50, "evaluate every this many steps (0: start and end only)")
    num_generations_eval: int = arg(4, "samples per held-out prompt (and one greedy)")
    per_device_eval_batch_size: int = arg(512, "completions per generate call of evaluation")
    save_steps: int = arg(10, "checkpoint every this many steps (0: never; a stop saves)")
    save_total_limit: int | None = arg(None, "keep only the newest N checkpoints")
    resume_from_checkpoint: str | None = arg(None, "a checkpoint, or 'latest' in output_dir")
    # efficiency
    bf16: bool = arg(False, "bf16 autocast; master weights stay float32")
    gradient_checkpointing: bool = arg(False, "recompute activations in the backward pass")
    use_peft: bool = arg(False, "train LoRA adapters of both models; π_ref: π_θ without it")
    lora_r: int = arg(16, "LoRA rank")
    lora_alpha: int = arg(32, "LoRA alpha")
    lora_dropout: float = arg(0.05, "LoRA dropout")
    lora_target_modules: list[str] = arg(["all-linear"], "modules LoRA adapts")
    load_in_4bit: bool = arg(False, "QLoRA: not in ppo.py, whose V_ψ trains too")
    bnb_4bit_quant_type: Literal["nf4", "fp4"] = arg("nf4", "4-bit data type")


def check_args(args: Args):
    """The flags in range, each said in one line."""
    positive = (
        "max_steps prompts_per_step learning_rate max_completion_length temperature"
        " logging_steps num_generations_eval per_device_eval_batch_size num_ppo_epochs"
        " num_mini_batches cliprange cliprange_value kl_target kl_horizon save_total_limit"
    )
    for name in positive.split():
        value = getattr(args, name)
        require(value is None or value > 0, f"--{name}: must be positive, got {value}")
    non_negative = (
        "kl_coef vf_coef micro_batch_size top_k eval_steps save_steps weight_decay max_grad_norm"
    )
    for name in non_negative.split():
        value = getattr(args, name)
        require(value >= 0, f"--{name}: must be ≥ 0, got {value}")
    for name in ("gamma", "lam", "warmup_ratio"):
        value = getattr(args, name)
        require(0 <= value <= 1, f"--{name}: must be in [0, 1], got {value}")
    require(0 < args.top_p <= 1, f"--top_p: must be in (0, 1], got {args.top_p}")
    require(0 <= args.seed < 2**32, f"--seed: must be in [0, 2**32), got {args.seed}")  # numpy's
    for name, default in asdict(type(args)()).items():
        if name.startswith("lora_") and not args.use_peft:
            require(getattr(args, name) == default, f"--{name}: it needs --use_peft")
    if args.load_in_4bit:
        raise BadInput(
            "--load_in_4bit: ppo.py trains a value model beside the policy; not with QLoRA"
        )
    if args.adaptive_kl:
        require(args.kl_coef > 0, "--adaptive_kl: needs a positive --kl_coef to start from")
    if args.dataset_train_split == args.dataset_test_split:
        raise BadInput("--dataset_test_split: the training split")


# ==== PPO ====
def per_token_kl(logprobs, ref_logprobs, estimator: str) -> torch.Tensor:
    """kl_t of each sampled token, unbiased: k1 = log π − log π_ref, or k3 = exp(−k1) + k1 − 1."""
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    return torch.exp(-log_ratio) + log_ratio - 1


def stop_token_ids(tokenizer, stop_token: str, end_ids: list[int]) -> list[int]:
    """--stop_token's ids: 'eos', the checkpoint's end ids; else one token's text."""
    if stop_token == "eos":
        return end_ids
    ids = tokenizer.encode(stop_token, add_special_tokens=False)
    if len(ids) != 1:
        raise BadInput(
            f"--stop_token: {stop_token!r} is {len(ids)} tokens for this tokenizer, not one"
        )
    return ids


def ends_with(completion_ids, completion_mask, token_ids: list[int]) -> torch.Tensor:
    """Whether each completion's last real token is one of `token_ids` (B,): not if truncated."""
    last_position = completion_mask.sum(1, keepdim=True) - 1  # every completion has a token
    last = completion_ids.gather(1, last_position)[:, 0]
    return torch.isin(last, torch.tensor(token_ids, device=last.device))


def completion_values(value_model, input_ids, attention_mask, T: int) -> torch.Tensor:
    """V(s_t) (B, T), float32, before each of the last T tokens: the head where the policy's
    logits for the token are (the classifier's own output is the last token's)."""
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # as in generation
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    hidden = value_model(**inputs, output_hidden_states=True, use_cache=False).hidden_states[-1]
    head = getattr(value_model, "module", value_model).score  # DDP: in .module; peft passes it on
    return head(hidden[:, -T - 1 : -1]).squeeze(-1).float()


def per_token_rewards(scores, kl, completion_mask, kl_coef: float) -> torch.Tensor:
    """r_t = −kl_coef · kl_t on each real token, plus the score on the last. -> (B, T)"""
    rewards = -kl_coef * kl * completion_mask
    last = completion_mask.sum(1).long() - 1  # every completion has at least one token
    rewards[torch.arange(len(scores), device=scores.device), last] += scores
    return rewards


def masked_moments(values, mask, accelerator):
    """Mean and variance (Bessel's) of the real tokens (`mask`) of every process."""
    count = accelerator.reduce(mask.sum(), "sum")
    mean = accelerator.reduce((values * mask).sum(), "sum") / count.clamp(min=1)
    squares = accelerator.reduce(((values - mean) ** 2 * mask).sum(), "sum")
    return mean, squares / (count - 1).clamp(min=1)


def masked_whiten(values, mask, accelerator, shift_mean=True) -> torch.Tensor:
    """(x − mean) / std on the real tokens, 0 on padding; shift_mean=False keeps the mean."""
    mean, variance = masked_moments(values, mask, accelerator)
    whitened = (values - mean) * torch.rsqrt(variance + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * mask


def gae_advantages(rewards, values, completion_mask, *, gamma: float, lam: float):
    """A_t = Σ_l (γλ)^l δ_{t+l}, δ_t = r_t + γ V_{t+1} − V_t, with r = V = 0 on padding.
    The advantages and the returns A + V, both (B, T)."""
    rewards = rewards * completion_mask
    values = values * completion_mask
    advantages = torch.zeros_like(rewards)
    next_advantage = 0.0
    next_value = 0.0
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_advantage = delta + gamma * lam * next_advantage
        advantages[:, t] = next_advantage
        next_value = values[:, t]
    advantages = advantages * completion_mask
    return advantages, advantages + values


def importance_sampling_weights(
    old_logprobs, sampler_logprobs, completion_mask, *, mode: str, clip_max: float
):
    """w = π_θ_old / π_sampler of each completion (B, 1) or token (token_*: (B, T)), capped at
    clip_max (*_truncate) or zeroed above it (*_mask)."""
    log_ratio = (old_logprobs - sampler_logprobs) * completion_mask
    if mode.startswith("sequence"):
        log_ratio = log_ratio.sum(1, keepdim=True)
    ratio = torch.exp(log_ratio)
    if mode.endswith("truncate"):
        return ratio.clamp(max=clip_max)
    return ratio.masked_fill(ratio > clip_max, 0.0)


def policy_loss(logprobs, old_logprobs, advantages, mask, weights, *, cliprange, num_tokens):
    """Σ_t w_t max(−A_t ρ_t, −A_t clip(ρ_t, 1 ± ε)) / num_tokens on a micro-batch's real tokens
    (num_tokens: the mini-batch's). The loss, ρ, and where the clipped term is larger."""
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - cliprange, 1 + cliprange)
    loss = (torch.max(unclipped, clipped) * weights * mask).sum() / num_tokens
    return loss, ratio, clipped > unclipped


def value_loss(values, old_values, returns, mask, *, cliprange_value, num_tokens):
    """½ Σ_t max((V − R)², (clip(V, V_old ± ε_v) − R)²) / num_tokens on the real tokens.
    The loss, and where the clipped term is larger."""
    clipped_values = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    unclipped = (values - returns) ** 2
    clipped = (clipped_values - returns) ** 2
    loss = 0.5 * (torch.max(unclipped, clipped) * mask).sum() / num_tokens
    return loss, clipped > unclipped


def adaptive_kl_coef(kl_coef, kl, *, kl_target, kl_horizon, batch_size) -> float:
    """Ziegler et al.'s: kl_coef · (1 + clip(KL / target − 1, ±0.2) · B / horizon)."""
    error = min(max(kl / kl_target - 1, -0.2), 0.2)
    return kl_coef * (1 + error * batch_size / kl_horizon)


# token means over every pass, logged; the last is E[ρ²], for val/ratio_var
TOKEN_STATS = (
    "policy/approxkl_avg",
    "policy/clipfrac_avg",
    "policy/entropy_avg",
    "val/clipfrac_avg",
    "val/ratio",
    "val/ratio_var",
)


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


# ---- ppo: the value model ----
def load_value_model(accelerator, args, tokenizer):
    """V_ψ to train: --value_model_path, else the reward model, else the policy with a new head
    at zero (V ≡ 0). A reward model that cannot read the policy's tokens only scores."""
    path = args.value_model_path
    flag = "--value_model_path"
    if not path:
        path = args.reward_model_path
        flag = "--reward_model_path"
    if path:
        with loading(flag, path):  # no such model, or no tokenizer in it
            vocabulary = transformers.AutoTokenizer.from_pretrained(path).get_vocab()
        if vocabulary != tokenizer.get_vocab():
            message = f"{flag}: {path} has another tokenizer than the policy's"
            require(not args.value_model_path, message)
            accelerator.print(f"{message}: V_ψ starts from the policy")
            path = None
    new_head = not path
    if new_head:  # the policy's backbone
        path = args.model_name_or_path
        flag = "--model_name_or_path"
    model = load_for_training(
        args,
        path,
        AutoModelForSequenceClassification,
        task_type="SEQ_CLS",
        flag=flag,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,  # the classifier finds the last token by it
    )
    if new_head:  # V ≡ 0 at the start
        with torch.no_grad():
            for parameter in model.score.parameters():
                parameter.zero_()
    return model


def load_weights(accelerator, model, folder: Path):
    """What `save_model` wrote into `folder` (--use_peft: the adapter), into the prepared model."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file, load_model

    unwrapped = accelerator.unwrap_model(model)
    if hasattr(unwrapped, "peft_config"):
        set_peft_model_state_dict(unwrapped, load_file(folder / "adapter_model.safetensors"))
    else:
        load_model(unwrapped, folder / "model.safetensors", device=str(accelerator.device))


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

    # ---- ppo: each process's share of the prompts, and its mini-batches ----
    backend = accelerator.distributed_type
    if backend in (DistributedType.DEEPSPEED, DistributedType.FSDP):
        raise BadInput(
            f"accelerate launch: {backend.value}: ppo.py trains two models with one optimizer, one process or DDP"
        )
    processes = accelerator.num_processes
    if args.prompts_per_step % processes != 0:
        raise BadInput(f"--prompts_per_step: not a multiple of the {processes} processes")
    local_batch_size = args.prompts_per_step // processes  # one completion per prompt
    first_prompt = accelerator.process_index * local_batch_size
    my_prompts = slice(first_prompt, first_prompt + local_batch_size)
    if local_batch_size % args.num_mini_batches != 0:
        raise BadInput(f"--num_mini_batches: must divide {local_batch_size} completions")
    mini_batch_size = local_batch_size // args.num_mini_batches
    micro_batch_size = args.micro_batch_size or mini_batch_size  # 0: the mini-batch
    if mini_batch_size % micro_batch_size != 0:
        raise BadInput(f"--micro_batch_size: must divide a mini-batch, {mini_batch_size}")

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

    # ---- ppo: π_θ, π_ref (kl_coef > 0; LoRA: π_θ, adapter off), the end ids, V_ψ ----
    model = load_for_training(args, args.model_name_or_path)
    check_context(model, tokenizer, train_texts + eval_texts, args.max_completion_length)
    ref_model = None
    if args.kl_coef > 0 and not args.use_peft:
        ref_model = AutoModelForCausalLM.from_pretrained(
            args.model_name_or_path,
            dtype=torch.bfloat16 if args.bf16 else torch.float32,  # frozen
            attn_implementation=args.attn_implementation,
        )
        ref_model = prepare_frozen(accelerator, ref_model)
    generation_config = common.sampling_config(model, tokenizer, args)
    # a completion ends at the checkpoint's end ids and at --stop_token
    stop_ids = stop_token_ids(tokenizer, args.stop_token, generation_config.eos_token_id)
    end_ids = sorted({*generation_config.eos_token_id, *stop_ids})
    generation_config.eos_token_id = end_ids
    value_model = load_value_model(accelerator, args, tokenizer)

    # ---- ppo: one AdamW, a parameter group per model, and the scheduler ----
    total_updates = args.max_steps * args.num_ppo_epochs * args.num_mini_batches
    policy_group = {"params": [p for p in model.parameters() if p.requires_grad]}
    value_group = {"params": [p for p in value_model.parameters() if p.requires_grad]}
    optimizer = torch.optim.AdamW(
        [policy_group, value_group],
        args.learning_rate,
        weight_decay=args.weight_decay,
        fused=True,
    )
    warmup = int(args.warmup_ratio * total_updates)
    scheduler = get_scheduler(args.lr_scheduler_type, optimizer, warmup, total_updates)
    model, value_model, optimizer, scheduler = accelerator.prepare(
        model, value_model, optimizer, scheduler
    )
    # one call per model: a loop variable would hold a DDP wrapper past end_training
    accelerator.unwrap_model(model, keep_fp32_wrapper=False)  # --bf16: the logits stay bf16
    accelerator.unwrap_model(value_model, keep_fp32_wrapper=False)  # and the values

    # ---- ppo: V_ψ in every checkpoint, in checkpoint-N/value_model ----
    # accelerate's hooks: V_ψ beside the policy, whose weights state/ does not hold either
    def save_value_model(models, model_weights, state_dir):
        folder = Path(state_dir).parent / "value_model"
        save_model(accelerator, args, value_model, tokenizer, folder, state)

    def load_value_model_weights(models, state_dir):
        load_weights(accelerator, value_model, Path(state_dir).parent / "value_model")

    accelerator.register_save_state_pre_hook(save_value_model)
    accelerator.register_load_state_pre_hook(load_value_model_weights)

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

        # ==== 1. rollout: one completion per prompt, ended at its first end token ====
        # the step alone picks its prompts (a fresh permutation each epoch): a resume sees the same
        epoch, position = divmod(step - 1, len(train_dataset) // args.prompts_per_step)
        seeded = torch.Generator().manual_seed(args.seed + epoch)
        order = torch.randperm(len(train_dataset), generator=seeded)
        start = position * args.prompts_per_step
        indices = order[start : start + args.prompts_per_step][my_prompts].tolist()
        texts = [train_texts[i] for i in indices]
        if vllm is not None:
            rollout = vllm.generate(texts, device)
        else:
            with unwrapped_for_generation(accelerator, model) as policy:
                rollout = common.generate(policy, tokenizer, texts, generation_config)
        completion_ids = rollout["completion_ids"]
        completion_mask, is_truncated = common.end_of_completion(completion_ids, end_ids)
        completion_ids = completion_ids.masked_fill(completion_mask == 0, tokenizer.pad_token_id)
        input_ids = torch.cat([rollout["prompt_ids"], completion_ids], 1)  # (B, P + T)
        attention_mask = torch.cat([rollout["prompt_mask"], completion_mask], 1)
        T = completion_ids.shape[1]

        # ==== 2. score: r(x, y), the reward functions' weighted sum, minus the EOS penalty ====
        completions, id_lists = common.decode(tokenizer, completion_ids, completion_mask)
        columns = train_dataset.select(indices).to_dict()
        prompts = columns.pop("prompt")
        rewards, rewards_per_func = compute_rewards(
            reward_funcs, weights, prompts, completions, id_lists, columns
        )
        rewards = rewards.to(device)  # (B,)
        rewards_per_func = rewards_per_func.to(device)  # (B, number of functions)
        stopped = ends_with(completion_ids, completion_mask, stop_ids)  # (B,): at --stop_token
        scores = rewards
        if args.missing_eos_penalty is not None:
            scores = rewards - args.missing_eos_penalty * (~stopped).float()

        # ==== 3. before any update, without gradients: log π_θ_old, V_old(s_t), kl_t to π_ref ====
        old_logprobs = torch.zeros(local_batch_size, T, device=device)
        old_values = torch.zeros(local_batch_size, T, device=device)
        kl = torch.zeros(local_batch_size, T, device=device)
        for mb in torch.arange(local_batch_size, device=device).split(micro_batch_size):
            ids, mask = input_ids[mb], attention_mask[mb]
            with torch.no_grad(), accelerator.autocast():
                old_logprobs[mb], _ = completion_logprobs(model, ids, mask, T, args.temperature)
                old_values[mb] = completion_values(value_model, ids, mask, T)
            if args.kl_coef > 0:  # else no reference model: kl = 0
                ref_logprobs = reference_logprobs(ids, mask, T)
                token_kl = per_token_kl(old_logprobs[mb], ref_logprobs, args.kl_estimator)
                kl[mb] = token_kl * completion_mask[mb]
        # w = π_θ_old / π_vllm when vLLM sampled (not π_θ), else 1
        off_policy = args.vllm_importance_sampling_correction and "sampler_logprobs" in rollout
        is_weights = torch.ones(local_batch_size, 1, device=device)  # (B, 1); token_*: (B, T)
        if off_policy:
            is_weights = importance_sampling_weights(
                old_logprobs,
                rollout["sampler_logprobs"],
                completion_mask,
                mode=args.vllm_importance_sampling_mode,
                clip_max=args.vllm_importance_sampling_clip_max,
            )

        # ==== 4. KL-shaped per-token rewards → GAE advantages and returns, whitened ====
        # unscorable (a NaN score: no reward function applies): no loss, not in the whitening
        loss_mask = completion_mask * ~scores.isnan()[:, None]  # (B, T)
        kl_coef = state.setdefault("kl_coef", args.kl_coef)  # --adaptive_kl's, checkpointed
        token_rewards = per_token_rewards(scores.nan_to_num(0.0), kl, completion_mask, kl_coef)
        if args.whiten_rewards:  # scaled, not shifted
            token_rewards = masked_whiten(token_rewards, loss_mask, accelerator, shift_mean=False)
        advantages, returns = gae_advantages(
            token_rewards, old_values, completion_mask, gamma=args.gamma, lam=args.lam
        )
        if args.whiten_advantages:
            advantages = masked_whiten(advantages, loss_mask, accelerator)

        # ==== 5. loss and update: num_ppo_epochs passes over fresh mini-batches ====
        # The losses are token means over a mini-batch of every process: DDP averages the
        # processes' gradients, so each divides by the mini-batch's token count / processes.
        token_sums = torch.zeros(len(TOKEN_STATS), device=device)  # the TOKEN_STATS' sums
        policy_losses, value_losses, grad_norms, value_grad_norms = [], [], [], []
        for _ in range(args.num_ppo_epochs):
            shuffled = torch.randperm(local_batch_size, device=device)
            for mini_batch in shuffled.split(mini_batch_size):
                tokens = accelerator.reduce(loss_mask[mini_batch].sum(), "sum")
                num_tokens = tokens.clamp(min=1) / processes
                micro_batches = mini_batch.split(micro_batch_size)
                policy_loss_sum = 0.0
                value_loss_sum = 0.0
                for k, mb in enumerate(micro_batches):
                    # DDP all-reduces the accumulated gradients at the last micro-batch alone
                    last = k == len(micro_batches) - 1
                    no_sync = contextlib.nullcontext if last else accelerator.no_sync
                    ids, mask = input_ids[mb], attention_mask[mb]
                    with no_sync(model), no_sync(value_model):
                        with accelerator.autocast():
                            logprobs, token_entropy = completion_logprobs(
                                model, ids, mask, T, args.temperature, entropy=logging_step
                            )
                            values = completion_values(value_model, ids, mask, T)
                        pg_loss, ratio, pg_clipped = policy_loss(
                            logprobs,
                            old_logprobs[mb],
                            advantages[mb],
                            loss_mask[mb],
                            is_weights[mb],
                            cliprange=args.cliprange,
                            num_tokens=num_tokens,
                        )
                        vf_loss, vf_clipped = value_loss(
                            values,
                            old_values[mb],
                            returns[mb],
                            loss_mask[mb],
                            cliprange_value=args.cliprange_value,
                            num_tokens=num_tokens,
                        )
                        accelerator.backward(pg_loss + args.vf_coef * vf_loss)
                    policy_loss_sum += pg_loss.item()
                    value_loss_sum += vf_loss.item()
                    if logging_step:  # the TOKEN_STATS, summed over the real tokens
                        approxkl = 0.5 * (logprobs - old_logprobs[mb]) ** 2
                        stats = (approxkl, pg_clipped, token_entropy, vf_clipped, ratio, ratio**2)
                        sums = [(x.detach().float() * loss_mask[mb]).sum() for x in stats]
                        token_sums += torch.stack(sums)
                max_norm = args.max_grad_norm or math.inf  # 0: no clipping, as in transformers
                policy_norm = accelerator.clip_grad_norm_(model.parameters(), max_norm)
                value_norm = accelerator.clip_grad_norm_(value_model.parameters(), max_norm)
                grad_norms.append(float(policy_norm))
                value_grad_norms.append(float(value_norm))
                checked = [policy_loss_sum, value_loss_sum, grad_norms[-1], value_grad_norms[-1]]
                if not all(math.isfinite(x) for x in checked):
                    progress.close()  # first: the error is then the log's last line
                    fail(f"step {step}: a loss or a gradient norm is not finite; no update saved")
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                policy_losses.append(policy_loss_sum)
                value_losses.append(value_loss_sum)

        # ==== 6. the adaptive KL controller: kl_coef towards the target, from the batch's KL ====
        sequence_kl = accelerator.gather(kl.sum(1))  # (prompts_per_step,): every process's
        if args.adaptive_kl:
            state["kl_coef"] = adaptive_kl_coef(
                kl_coef,
                sequence_kl.mean().item(),
                kl_target=args.kl_target,
                kl_horizon=args.kl_horizon,
                batch_size=args.prompts_per_step,
            )

        # ==== 7. log: TRL's PPO statistics over the whole batch, from every process ====
        state["num_tokens"] += accelerator.reduce(attention_mask.sum(), "sum").item()
        if logging_step:
            lengths = completion_mask.sum(1).float()
            all_lengths = accelerator.gather(lengths)
            all_rewards = accelerator.gather(rewards)
            per_func = accelerator.gather(rewards_per_func)
            all_scores = accelerator.gather(scores)
            truncated = accelerator.gather(is_truncated).float()
            num_stopped = accelerator.gather(stopped).sum()
            entropy = accelerator.gather((-old_logprobs * completion_mask).sum(1))
            tokens = accelerator.reduce(loss_mask.sum(), "sum").clamp(min=1)
            token_means = accelerator.reduce(token_sums, "sum") / (tokens * args.num_ppo_epochs)
            policy_loss_mean = torch.tensor(policy_losses, device=device).mean()
            value_loss_mean = torch.tensor(value_losses, device=device).mean()
            non_score_rewards = -kl_coef * sequence_kl
            metrics = {
                "objective/kl": sequence_kl.mean().item(),
                "objective/entropy": entropy.mean().item(),
                "objective/non_score_reward": non_score_rewards.mean().item(),
                "objective/rlhf_reward": (all_scores + non_score_rewards).nanmean().item(),
                "objective/scores": all_scores.nanmean().item(),
                "objective/kl_coef": kl_coef,
            }
            metrics |= dict(zip(TOKEN_STATS, token_means.tolist()))
            metrics["val/ratio_var"] -= metrics["val/ratio"] ** 2  # E[ρ²] − E[ρ]²
            metrics["loss/policy_avg"] = accelerator.reduce(policy_loss_mean, "mean").item()
            metrics["loss/value_avg"] = accelerator.reduce(value_loss_mean, "mean").item()
            metrics["val/num_eos_tokens"] = num_stopped.item()
            metrics["reward"] = all_rewards.nanmean().item()
            for j, name in enumerate(reward_funcs):
                metrics[f"rewards/{name}/mean"] = per_func[:, j].nanmean().item()
            metrics["completions/mean_length"] = all_lengths.mean().item()
            metrics["completions/clipped_ratio"] = truncated.mean().item()
            metrics["grad_norm"] = sum(grad_norms) / len(grad_norms)
            metrics["val/grad_norm"] = sum(value_grad_norms) / len(value_grad_norms)
            if off_policy:  # w of each completion: the mean over its tokens in the token_* modes
                is_means = (is_weights * completion_mask).sum(1) / lengths
                is_mean = accelerator.gather(is_means).mean().item()
                metrics["sampling/importance_sampling_ratio/mean"] = is_mean

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

    # ---- ppo: V_ψ beside the final model, in output_dir/value_model ----
    value_folder = Path(args.output_dir) / "value_model"
    save_model(accelerator, args, value_model, tokenizer, value_folder, state)
    value_model = None  # its DDP wrapper holds the process group too: see end_training below

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
