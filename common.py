"""Plumbing shared by the training scripts: arguments, the built-in arithmetic task, data loading, tokenization,
generation, log-probs, evaluation, checkpoints and metric logging.

Nothing algorithmic lives here. Rewards live in `rewards.py`; baselines, advantages and losses stay in each script,
so that `diff rloo.py grpo.py` shows the algorithmic difference.
"""

import contextlib
import dataclasses
import json
import math
import os
import random
import shutil
import signal
import sys
import threading
from pathlib import Path

import torch
from datasets import Dataset, get_dataset_split_names, load_dataset
from transformers import GenerationConfig, HfArgumentParser

ROOT = Path(__file__).resolve().parent
EMBEDDED_MODEL = str(ROOT / "models" / "tiny-arith")
"""The shipped ~1M-parameter warm-start policy (made by `sft.py --from_scratch`); the default everywhere."""


class ConfigError(Exception):
    """Bad user input. Scripts report it as one line that names the flag or field, and exit with status 2."""


def arg(default, help: str):
    """A dataclass field whose one-line help shows in `--help` (HfArgumentParser reads `metadata["help"]`)."""
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: default, metadata={"help": help})
    return dataclasses.field(default=default, metadata={"help": help})


def cli(main, args_class, argv=None):
    """Parse `args_class` from the command line and run `main(args)`; a ConfigError becomes one line and exit 2."""
    (args,) = HfArgumentParser(args_class).parse_args_into_dataclasses(args=argv)
    try:
        main(args)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


def require(condition: bool, message: str):
    if not condition:
        raise ConfigError(message)


def split_list(text: str | None, cast=str) -> list:
    """'accuracy, format' -> ['accuracy', 'format']; empty or None -> []."""
    return [cast(item.strip()) for item in (text or "").split(",") if item.strip()]


@contextlib.contextmanager
def graceful_interrupt():
    """Ctrl-C sets the yielded event instead of raising: the loop finishes its step, saves a checkpoint and exits.
    A second Ctrl-C interrupts at once."""
    event = threading.Event()
    previous = signal.getsignal(signal.SIGINT)

    def handler(signum, frame):
        event.set()
        signal.signal(signal.SIGINT, previous)

    signal.signal(signal.SIGINT, handler)
    try:
        yield event
    finally:
        signal.signal(signal.SIGINT, previous)


def seed_everything(seed: int):
    random.seed(seed)
    torch.manual_seed(seed)  # seeds CUDA too


# ----------------------------------------------------------------------------------------------------------------------
# The built-in task: one-digit arithmetic in the seed's format, answered as <answer>N</answer>.
# ----------------------------------------------------------------------------------------------------------------------
OPERATORS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "×": lambda a, b: a * b, "÷": lambda a, b: a // b}
HELD_OUT_FRACTION = 0.2
TASK_SEED = 1234  # fixed: every run, whatever its --seed, sees the same train / test split


def arithmetic_problems() -> list[tuple[int, str, int, int]]:
    """Every one-digit problem (a, op, b, answer); division only where it is exact and b != 0."""
    problems = []
    for op in OPERATORS:
        for a in range(10):
            for b in range(10):
                if op == "÷":
                    if b == 0:
                        continue
                    a_times_b = a * b  # (a·b) ÷ b = a: exact division with a one-digit divisor and quotient
                    problems.append((a_times_b, op, b, a))
                else:
                    problems.append((a, op, b, OPERATORS[op](a, b)))
    return problems


def arithmetic_question(a: int, op: str, b: int) -> str:
    return f"Compute {a} {op} {b}. Answer in the form <answer>N</answer>."


def arithmetic_split(split: str) -> list[tuple[int, str, int, int]]:
    """A seeded, fixed partition of the problems: 'train' and 'test' never share a problem."""
    problems = arithmetic_problems()
    random.Random(TASK_SEED).shuffle(problems)
    n_test = round(HELD_OUT_FRACTION * len(problems))
    return problems[n_test:] if split == "train" else problems[:n_test]


def arithmetic_dataset(split: str) -> Dataset:
    """Conversational prompts with a `ground_truth` column, as the seed's RAW_DATA → build_prompt does."""
    rows = [
        {"prompt": [{"role": "user", "content": arithmetic_question(a, op, b)}], "ground_truth": str(answer)}
        for a, op, b, answer in arithmetic_split(split)
    ]
    return Dataset.from_list(rows)


# ----------------------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------------------
FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


def load_split(dataset_name: str, split: str, builtin: dict | None = None, flag: str = "--dataset_name") -> Dataset | None:
    """One split of a dataset: a built-in name, a local data file, a local folder, or a hub dataset name.

    A single local file is its 'train' split. Returns None when the split does not exist.
    """
    if builtin and dataset_name in builtin:
        return builtin[dataset_name](split)
    path = Path(dataset_name)
    if path.suffix in FILE_BUILDERS:
        require(path.is_file(), f"{flag}: no such file: {dataset_name}")
        if split != "train":
            return None
        try:
            return load_dataset(FILE_BUILDERS[path.suffix], data_files=str(path), split="train")
        except Exception as error:  # a malformed file: say which flag and file
            raise ConfigError(f"{flag}: cannot read {dataset_name}: {str(error).splitlines()[0]}") from None
    if dataset_name.startswith((".", "/", "~")) or path.exists():
        require(path.is_dir(), f"{flag}: no such file or folder: {dataset_name}")
    try:  # a hub dataset name or a local folder of data files: the same datasets call serves both
        if split not in get_dataset_split_names(dataset_name):
            return None
        return load_dataset(dataset_name, split=split)
    except Exception as error:
        raise ConfigError(f"{flag}: cannot load {dataset_name!r}: {str(error).splitlines()[0]}") from None


def check_prompt_column(dataset: Dataset, flag: str = "--dataset_name"):
    require("prompt" in dataset.column_names, f"{flag}: the dataset has no 'prompt' column (columns: {dataset.column_names})")


def is_conversational(prompt) -> bool:
    return isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt)


def prompt_text(tokenizer, prompt) -> str:
    """A conversational prompt goes through the chat template; a standard (string) prompt is used as it is."""
    if is_conversational(prompt):
        require(tokenizer.chat_template is not None, "--model_name_or_path: conversational prompts need a tokenizer with a chat template")
        return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    require(isinstance(prompt, str), f"prompt: expected a string or a list of messages, got {type(prompt).__name__}")
    return prompt


def as_completion(prompt, text: str):
    """TRL's convention: conversational prompts get completions as a message list, standard ones as plain text."""
    return [{"role": "assistant", "content": text}] if is_conversational(prompt) else text


# ----------------------------------------------------------------------------------------------------------------------
# Tokenizer, models
# ----------------------------------------------------------------------------------------------------------------------
def load_tokenizer(path: str, flag: str = "--model_name_or_path"):
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    except (OSError, ValueError) as error:
        raise ConfigError(f"{flag}: cannot load a tokenizer from {path!r}: {str(error).splitlines()[0]}") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(path: str, flag: str = "--model_name_or_path", **kwargs):
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except (OSError, ValueError) as error:
        raise ConfigError(f"{flag}: cannot load a model from {path!r}: {str(error).splitlines()[0]}") from None


def lora_config(args, task_type: str = "CAUSAL_LM"):
    """peft's LoraConfig from the shared --lora_* flags."""
    from peft import LoraConfig

    targets = split_list(args.lora_target_modules)
    return LoraConfig(
        task_type=task_type,
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=targets[0] if targets == ["all-linear"] else targets,
    )


def sampling_config(tokenizer, args, greedy: bool = False) -> GenerationConfig:
    """Exactly the distribution the log-probs assume: softmax(logits / temperature), optionally top-k / top-p.

    A fresh GenerationConfig, so a hub model's generation_config.json (repetition penalty, its own top_k, ...) cannot
    silently change what is sampled.
    """
    return GenerationConfig(
        do_sample=not greedy,
        temperature=1.0 if greedy else args.temperature,
        top_p=1.0 if greedy else args.top_p,
        top_k=None if greedy else (args.top_k or None),
        max_new_tokens=args.max_completion_length,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


@torch.no_grad()
def generate(model, tokenizer, texts: list[str], generation_config: GenerationConfig) -> dict:
    """Sample one completion per text. Completion tokens after the first EOS are masked out.

    Returns prompt_ids / prompt_mask (B, P) left-padded, completion_ids / completion_mask (B, T) right-padded, and
    is_truncated (B,): no EOS within max_completion_length.
    """
    device = next(model.parameters()).device
    enc = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False).to(device)
    sequences = model.generate(**enc, generation_config=generation_config)
    completion_ids = sequences[:, enc.input_ids.shape[1]:]
    is_eos = completion_ids == tokenizer.eos_token_id
    first_eos = torch.where(is_eos.any(1), is_eos.int().argmax(1), completion_ids.shape[1])
    completion_mask = (torch.arange(completion_ids.shape[1], device=device)[None] <= first_eos[:, None]).long()
    completion_ids = completion_ids.masked_fill(completion_mask == 0, tokenizer.pad_token_id)
    return {
        "prompt_ids": enc.input_ids,
        "prompt_mask": enc.attention_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "is_truncated": ~is_eos.any(1),
    }


def decode_completions(tokenizer, completion_ids: torch.Tensor) -> list[str]:
    return tokenizer.batch_decode(completion_ids, skip_special_tokens=True)


def completion_logprobs(model, input_ids, attention_mask, num_completion_tokens: int, temperature: float, entropy: bool = False):
    """Log-probs (B, T) of the last T tokens of `input_ids` (the completion) under softmax(logits / temperature).

    Only the T completion positions get logits (`logits_to_keep`), and the log-prob of the sampled token is
    logit - logsumexp: the (B, T, V) log-softmax is never materialized. With `entropy=True`, also returns the detached
    full-vocabulary entropy (B, T), a diagnostic. Position ids come from the attention mask, as in generation, so a
    left-padded prompt gets the same positions here as when it was sampled.
    """
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, logits_to_keep=num_completion_tokens + 1
    ).logits[:, :-1].float() / temperature  # (B, T, V): position t predicts completion token t
    targets = input_ids[:, -num_completion_tokens:]
    logsumexp = logits.logsumexp(-1)
    logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logsumexp
    if not entropy:
        return logprobs
    with torch.no_grad():
        probs = torch.softmax(logits, -1)
        token_entropy = logsumexp - (probs * logits).sum(-1)
    return logprobs, token_entropy


def nanstd(values: torch.Tensor) -> float:
    """Standard deviation ignoring NaN (a reward function's "not applicable")."""
    values = values[~values.isnan()]
    return values.std().item() if len(values) > 1 else 0.0


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    mask = mask.to(values.dtype)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1)


# ----------------------------------------------------------------------------------------------------------------------
# Evaluation: held-out accuracy, sampled at the training temperature and greedy
# ----------------------------------------------------------------------------------------------------------------------
@torch.no_grad()
def evaluate(model, tokenizer, eval_dataset: Dataset, args, reward_fns: dict, seed: int) -> dict:
    """Mean of each reward function on held-out prompts: `eval/<name>` sampled (`num_generations_eval` samples per
    prompt at the training temperature) and `eval/<name>_greedy`. Runs under its own RNG, so evaluating never changes
    what training samples."""
    was_training = model.training
    model.eval()
    columns = eval_dataset.column_names
    metrics = {}
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if torch.cuda.is_available() else []):
        torch.manual_seed(seed)
        for suffix, repeats, config in (
            ("", args.num_generations_eval, sampling_config(tokenizer, args)),
            ("_greedy", 1, sampling_config(tokenizer, args, greedy=True)),
        ):
            rows = [row for row in eval_dataset for _ in range(repeats)]
            scores = {name: [] for name in reward_fns}
            for start in range(0, len(rows), args.per_device_eval_batch_size):
                batch = rows[start:start + args.per_device_eval_batch_size]
                prompts = [row["prompt"] for row in batch]
                out = generate(model, tokenizer, [prompt_text(tokenizer, p) for p in prompts], config)
                texts = decode_completions(tokenizer, out["completion_ids"])
                completions = [as_completion(p, t) for p, t in zip(prompts, texts)]
                kwargs = {c: [row[c] for row in batch] for c in columns if c != "prompt"}
                for name, fn in reward_fns.items():
                    scores[name] += fn(prompts=prompts, completions=completions, **kwargs)
            for name, values in scores.items():
                metrics[f"eval/{name}{suffix}"] = sum(values) / len(values)
    model.train(was_training)
    return metrics


# ----------------------------------------------------------------------------------------------------------------------
# Checkpoints: HF-format model + tokenizer (or adapter), plus optimizer, scheduler, RNG and step
# ----------------------------------------------------------------------------------------------------------------------
def save_checkpoint(output_dir: str, step: int, model, tokenizer, optimizer, scheduler, extra: dict | None = None) -> Path:
    """Write `checkpoint-{step}` atomically (a temporary folder renamed at the end: never half-written)."""
    final = Path(output_dir) / f"checkpoint-{step}"
    tmp = Path(output_dir) / f".checkpoint-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    state = {
        "step": step,
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python_rng": random.getstate(),
        **(extra or {}),
    }
    torch.save(state, tmp / "training_state.pt")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


def resolve_checkpoint(resume_from_checkpoint: str | None, output_dir: str) -> Path | None:
    """None, a checkpoint folder, or 'latest' (the highest-step checkpoint in output_dir)."""
    if not resume_from_checkpoint:
        return None
    if resume_from_checkpoint == "latest":
        found = sorted(Path(output_dir).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
        require(bool(found), f"--resume_from_checkpoint latest: no checkpoint-* folder in {output_dir}")
        return found[-1]
    path = Path(resume_from_checkpoint)
    require((path / "training_state.pt").is_file(), f"--resume_from_checkpoint: {path} is not a checkpoint (no training_state.pt)")
    return path


def load_training_state(checkpoint: Path, optimizer, scheduler) -> dict:
    """Restore optimizer, scheduler and RNG states; returns the whole saved dict (step, script-specific extras)."""
    state = torch.load(checkpoint / "training_state.pt", weights_only=False, map_location="cpu")
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    random.setstate(state["python_rng"])
    return state


def save_final_model(output_dir: str, model, tokenizer, save_merged: bool = False):
    """The trained model in HF format at output_dir; with LoRA the adapter, and with `save_merged` also the merged
    full model in output_dir/merged, loadable with AutoModelForCausalLM.from_pretrained."""
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    if save_merged and hasattr(model, "merge_and_unload"):
        merged_dir = Path(output_dir) / "merged"
        model.merge_and_unload().save_pretrained(merged_dir)
        tokenizer.save_pretrained(merged_dir)


# ----------------------------------------------------------------------------------------------------------------------
# Logging: {output_dir}/metrics.jsonl (one object per logged step), plus TensorBoard or W&B on request
# ----------------------------------------------------------------------------------------------------------------------
class MetricsLogger:
    def __init__(self, output_dir: str, report_to: str, config: dict, resume_step: int = 0):
        require(report_to in ("none", "tensorboard", "wandb"), f"--report_to: expected none, tensorboard or wandb, got {report_to!r}")
        self.path = Path(output_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if resume_step and self.path.exists():  # a resumed run continues the file: drop records past the checkpoint
            kept = [line for line in self.path.read_text().splitlines() if line and json.loads(line)["step"] <= resume_step]
        self.path.write_text("".join(line + "\n" for line in kept))
        self.writer = self.wandb = None
        if report_to == "tensorboard":
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ConfigError("--report_to tensorboard: the tensorboard package is not installed (pip install tensorboard)") from None
            self.writer = SummaryWriter(str(Path(output_dir) / "runs"))
        elif report_to == "wandb":
            try:
                import wandb
            except ImportError:
                raise ConfigError("--report_to wandb: the wandb package is not installed (pip install wandb)") from None
            self.wandb = wandb.init(config=config, dir=output_dir)

    def log(self, step: int, metrics: dict):
        record = {"step": step, **{k: (float(v) if isinstance(v, (int, float)) else v) for k, v in metrics.items()}}
        record = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        for key, value in metrics.items():
            if self.writer is not None:
                self.writer.add_scalar(key, value, step)
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)

    def close(self):
        if self.writer is not None:
            self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()


def read_metrics(output_dir: str) -> list[dict]:
    path = Path(output_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line]
