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
from accelerate import Accelerator, DistributedType, PartialState
from accelerate.utils import gather_object
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
# Processes: every script runs as one process, or as N under `accelerate launch` (DDP, DeepSpeed, FSDP)
# ----------------------------------------------------------------------------------------------------------------------
def make_accelerator(args) -> Accelerator:
    """accelerate's Accelerator: one process, or whatever `accelerate launch` set up. `--bf16` forces bf16 autocast;
    otherwise the launch config's mixed precision applies."""
    accelerator = Accelerator(mixed_precision="bf16" if args.bf16 else None)
    if accelerator.state.deepspeed_plugin is not None:  # no DataLoader is prepared, so DeepSpeed's batch bookkeeping
        accelerator.state.deepspeed_plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = 1  # needs a number
    return accelerator


def shard(accelerator: Accelerator, total: int, flag: str) -> slice:
    """This process's contiguous share of `total` items (prompts of a step, sequences of a batch)."""
    n = accelerator.num_processes
    require(total % n == 0, f"{flag}: {total} is not divisible by the {n} processes")
    return slice(accelerator.process_index * total // n, (accelerator.process_index + 1) * total // n)


def any_process(accelerator: Accelerator, flag: bool) -> bool:
    """True when `flag` is set on any process (a Ctrl-C seen by one rank stops them all at the same step)."""
    if accelerator.num_processes == 1:
        return flag
    return bool(accelerator.reduce(torch.tensor(float(flag), device=accelerator.device), "sum").item() > 0)


def check_backend(accelerator: Accelerator, one_backward_per_update: bool, rescales_gradients: bool = False):
    """DeepSpeed takes its optimizer step inside `backward` and keeps the gradients to itself: under DeepSpeed an update
    must be a single backward pass, and the accumulated gradient cannot be rescaled afterwards."""
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        require(one_backward_per_update, "--micro_batch_size: under DeepSpeed each update is one backward pass: leave it 0 (the whole per-process batch)")
        require(not rescales_gradients, "--normalize_advantages: not available under DeepSpeed (it rescales the accumulated gradient)")


@contextlib.contextmanager
def generation_model(accelerator: Accelerator, model):
    """The plain model for `generate`, without the DDP wrapper. Under DeepSpeed ZeRO-3 the parameters are gathered for
    the duration (as TRL does), so generation runs without a collective per token; under FSDP2 the module is its own
    unwrapped model and transformers keeps the ranks in step (`synced_gpus`)."""
    unwrapped = accelerator.unwrap_model(model)
    if accelerator.distributed_type == DistributedType.DEEPSPEED and accelerator.state.deepspeed_plugin.zero_stage == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(model.parameters())):
            yield unwrapped
    else:
        yield unwrapped


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
    """softmax(logits / temperature), or greedy decoding, and nothing else; `generate` keeps a checkpoint's own
    generation_config.json (repetition penalty, min_new_tokens, its top_k, ...) out of it.

    The log-probs are those of the full softmax(logits / temperature), as in TRL: with --top_k > 0 or --top_p < 1 the
    sampler draws from a truncated distribution that the log-probs do not describe, so training is off-policy.
    """
    # top_k 0 = off (None would let transformers fill in its default of 50); greedy decoding takes no sampling flags
    sampling = {} if greedy else {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k}
    return GenerationConfig(
        do_sample=not greedy,
        max_new_tokens=args.max_completion_length,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **sampling,
    )


def disable_dropout(model):
    """Dropout off everywhere (TRL's `disable_dropout`): dropout modules, LoRA's included, and the attention dropout
    that transformers' attention layers apply as a float attribute. Then a train-mode forward equals the eval-mode
    sampler's, and π_old, the KL and the ratio of one batch are computed on the same function."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0
    return model


@torch.no_grad()
def generate(model, tokenizer, texts: list[str], generation_config: GenerationConfig) -> dict:
    """Sample one completion per text with `model.generate`, which stops a completion at any of the config's
    `eos_token_id`s and pads it after. Returns prompt_ids / prompt_mask (B, P), left-padded, and the sampled
    completion_ids (B, T); where each completion ends (its mask) is the training script's to say."""
    device = next(model.parameters()).device
    enc = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False).to(device)
    # transformers fills every field `generation_config` leaves unset from the model's own generation_config (a hub
    # checkpoint's repetition penalty, min_new_tokens, suppressed tokens, ...): swap it out while sampling
    transformers_model = model.get_base_model() if hasattr(model, "get_base_model") else model  # under peft
    shipped, transformers_model.generation_config = transformers_model.generation_config, generation_config
    try:
        sequences = model.generate(**enc, generation_config=generation_config)
    finally:
        transformers_model.generation_config = shipped
    return {"prompt_ids": enc.input_ids, "prompt_mask": enc.attention_mask, "completion_ids": sequences[:, enc.input_ids.shape[1]:]}


def sample_completions(accelerator: Accelerator, model, tokenizer, texts: list[str], generation_config: GenerationConfig, vllm=None) -> dict:
    """One completion per text (the tensors of `generate`): from the colocated vLLM engine when there is one (--use_vllm,
    vllm_colocate.py), else from the policy itself, in eval mode."""
    if vllm is not None:
        return vllm.generate(texts, accelerator.device)
    model.eval()
    with generation_model(accelerator, model) as policy:
        out = generate(policy, tokenizer, texts, generation_config)
    model.train()
    return out


def decode_completions(tokenizer, completion_ids: torch.Tensor) -> list[str]:
    return tokenizer.batch_decode(completion_ids, skip_special_tokens=True)


NO_SIGNAL_STEPS = 10  # steps in a row without any reward signal before the warning


def warn_no_reward_signal(accelerator: Accelerator, reward_funcs: dict, args):
    """Said once when, for NO_SIGNAL_STEPS steps in a row, every group's completions scored the same: the advantages are
    then zero (up to the KL term) and the run cannot learn from the reward."""
    if accelerator.is_main_process:
        print(f"\nwarning: no reward signal for {NO_SIGNAL_STEPS} steps in a row: the completions of every group got "
              f"equal rewards from {', '.join(reward_funcs)}, so the policy gradient of the reward is zero. Usual causes: "
              f"a reward too strict for this model (e.g. an answer format it never produces), or --max_completion_length "
              f"{args.max_completion_length} too short to reach the answer.", file=sys.stderr, flush=True)


def nanstd(values: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sample standard deviation ignoring NaN (unscorable rewards); NaN where fewer than two values count."""
    count = (~values.isnan()).sum(dim)
    centered = values - (values.nanmean() if dim is None else values.nanmean(dim, keepdim=True))
    return (centered.pow(2).nansum(dim) / (count - 1)).sqrt()


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    mask = mask.to(values.dtype)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1)


# ----------------------------------------------------------------------------------------------------------------------
# Evaluation: held-out accuracy, sampled at the training temperature and greedy
# ----------------------------------------------------------------------------------------------------------------------
@torch.no_grad()
def evaluate(model, tokenizer, eval_dataset: Dataset, args, reward_fns: dict, seed: int, end_ids=None) -> dict:
    """Mean of each reward function on held-out prompts: `eval/<name>` sampled (`num_generations_eval` samples per
    prompt at the training temperature) and `eval/<name>_greedy`; a completion ends at the training's end tokens
    (`end_ids`, default the tokenizer's EOS). Runs under its own RNG, so evaluating never changes what training samples.
    With several processes, each scores an equal share of the prompts (padded by repeating the last one, which is
    dropped again) and every process returns the same means."""
    processes = PartialState()  # the process layout `accelerate launch` set up (one process without it)
    was_training = model.training
    model.eval()
    columns = eval_dataset.column_names
    metrics = {}
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if torch.cuda.is_available() else []):
        torch.manual_seed(seed + 1000 * processes.process_index)
        for suffix, repeats, config in (
            ("", args.num_generations_eval, sampling_config(tokenizer, args)),
            ("_greedy", 1, sampling_config(tokenizer, args, greedy=True)),
        ):
            config.eos_token_id = end_ids or config.eos_token_id
            rows = [row for row in eval_dataset for _ in range(repeats)]
            scores = {name: {} for name in reward_fns}  # row index -> score; a padded duplicate overwrites its original
            everyone = list(range(len(rows)))
            everyone += everyone[-1:] * (processes.num_processes - len(everyone))  # fewer rows than processes: repeat
            with processes.split_between_processes(everyone, apply_padding=True) as indices:
                for start in range(0, len(indices), args.per_device_eval_batch_size):
                    batch_indices = indices[start:start + args.per_device_eval_batch_size]
                    batch = [rows[i] for i in batch_indices]
                    prompts = [row["prompt"] for row in batch]
                    out = generate(model, tokenizer, [prompt_text(tokenizer, p) for p in prompts], config)
                    texts = decode_completions(tokenizer, out["completion_ids"])
                    completions = [as_completion(p, t) for p, t in zip(prompts, texts)]
                    kwargs = {c: [row[c] for row in batch] for c in columns if c != "prompt"}
                    for name, fn in reward_fns.items():
                        scores[name].update(zip(batch_indices, fn(prompts=prompts, completions=completions, **kwargs)))
            for name, local in scores.items():
                merged = {i: v for part in gather_object([local]) for i, v in part.items()}
                metrics[f"eval/{name}{suffix}"] = sum(merged.values()) / len(merged)
    model.train(was_training)
    return metrics


# ----------------------------------------------------------------------------------------------------------------------
# Checkpoints: HF-format model + tokenizer (or adapter), plus optimizer, scheduler, RNG and step
# ----------------------------------------------------------------------------------------------------------------------
def save_checkpoint(accelerator: Accelerator, output_dir: str, step: int, model, tokenizer, extra: dict | None = None) -> Path:
    """Write `checkpoint-{step}`: the model in HF format (or the LoRA adapter) and the tokenizer, for people;
    `accelerator_state/` (accelerate's own: model, optimizer, registered scheduler, every process's RNG; sharded
    states under DeepSpeed / FSDP), for resuming; `training_state.pt` with the step and the script's extras. Written
    to a temporary folder and renamed at the end: never half-written. Every process must call it."""
    final = Path(output_dir) / f"checkpoint-{step}"
    tmp = Path(output_dir) / f".checkpoint-{step}.tmp"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp / "accelerator_state"))
    save_model(accelerator, tmp, model, tokenizer)
    if accelerator.is_main_process:
        torch.save({"step": step, **(extra or {})}, tmp / "training_state.pt")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    accelerator.wait_for_everyone()
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


def load_training_state(accelerator: Accelerator, checkpoint: Path) -> dict:
    """Restore what `save_checkpoint` saved into the prepared model(s) and optimizer(s), the registered scheduler and
    this process's RNG; returns the step and the script's extras. Resume with the same number of processes."""
    saved = len(list((checkpoint / "accelerator_state").glob("random_states_*.pkl")))
    require(saved == accelerator.num_processes, f"--resume_from_checkpoint: {checkpoint} was saved by {saved} processes; resume it with as many (got {accelerator.num_processes})")
    accelerator.load_state(str(checkpoint / "accelerator_state"))
    return torch.load(checkpoint / "training_state.pt", weights_only=False, map_location="cpu")


def save_model(accelerator: Accelerator, output_dir, model, tokenizer):
    """The model in HF format (with LoRA: the adapter) and the tokenizer, written by the main process; the weights
    come from `accelerator.get_state_dict`, which gathers DeepSpeed ZeRO-3 / FSDP shards. Every process must call it."""
    state_dict = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        accelerator.unwrap_model(model).save_pretrained(output_dir, state_dict=state_dict)
        tokenizer.save_pretrained(output_dir)


def save_final_model(accelerator: Accelerator, output_dir: str, model, tokenizer, save_merged: bool = False):
    """The trained model in HF format at output_dir; with LoRA the adapter, and with `save_merged` also the merged
    full model in output_dir/merged, loadable with AutoModelForCausalLM.from_pretrained."""
    save_model(accelerator, output_dir, model, tokenizer)
    unwrapped = accelerator.unwrap_model(model)
    if save_merged and hasattr(unwrapped, "merge_and_unload") and accelerator.is_main_process:
        merged_dir = Path(output_dir) / "merged"
        unwrapped.merge_and_unload().save_pretrained(merged_dir)
        tokenizer.save_pretrained(merged_dir)
    accelerator.wait_for_everyone()


# ----------------------------------------------------------------------------------------------------------------------
# Logging: {output_dir}/metrics.jsonl (one object per logged step), plus TensorBoard or W&B on request
# ----------------------------------------------------------------------------------------------------------------------
class MetricsLogger:
    """Only the main process writes (pass `enabled=accelerator.is_main_process`); on the others `log` does nothing."""

    def __init__(self, output_dir: str, report_to: str, config: dict, resume_step: int = 0, enabled: bool = True):
        require(report_to in ("none", "tensorboard", "wandb"), f"--report_to: expected none, tensorboard or wandb, got {report_to!r}")
        self.enabled = enabled
        self.writer = self.wandb = None
        if not enabled:
            return
        self.path = Path(output_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if resume_step and self.path.exists():  # a resumed run continues the file: drop records past the checkpoint
            kept = [line for line in self.path.read_text().splitlines() if line and json.loads(line)["step"] <= resume_step]
        self.path.write_text("".join(line + "\n" for line in kept))
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
        if not self.enabled:
            return
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
