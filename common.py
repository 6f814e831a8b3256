"""Plumbing shared by the training scripts, and nothing else.

What may live here: what every script needs and no equation mentions. Arguments (the `Args` field helper, parsing,
the checks of the flags several scripts share, one-line errors), the built-in arithmetic task and data loading,
tokenization and prompt rendering, sampling with `generate` (which returns the sampled ids; where a completion ends
is the script's to say), processes under `accelerate launch`, held-out evaluation, checkpoints, stops (Ctrl-C,
SIGTERM) and the output folder, and logging (including the metrics that only summarize, like completion lengths).

What may not: any quantity of a script's docstring equations. The log-probs at the temperature, the end-of-completion
mask, the KL, baselines, advantages and losses are computed in each algorithm script, where a reader of the math
finds them. Reward functions and how rewards combine live in `rewards.py`, which stands alone (this file imports its
errors and TRL's conventions from there); the colocated vLLM engine lives in `vllm_colocate.py`.
"""

import argparse
import contextlib
import ctypes
import dataclasses
import difflib
import errno
import functools
import gc
import hashlib
import importlib.util
import json
import logging
import math
import os
import random
import re
import shutil
import signal
import socket
import sys
import threading
import time
import warnings
from pathlib import Path

import filelock
import torch
import transformers
import yaml
from accelerate import Accelerator, DistributedType, PartialState
from accelerate.tracking import LOGGER_TYPE_TO_CLASS, GeneralTracker, get_available_trackers
from accelerate.utils import LoggerType, ProjectConfiguration, broadcast_object_list, gather_object, get_int_from_env
from accelerate.utils import reduce as reduce_over_processes
from datasets import Dataset, get_dataset_split_names, load_dataset
from datasets import config as datasets_config
from safetensors import safe_open
from safetensors.torch import load_file
from tqdm.auto import tqdm
from transformers import GenerationConfig, HfArgumentParser
from transformers.utils import logging as transformers_logging

# defined in rewards.py, which imports nothing from this project so that it can be copied alone
from rewards import (  # noqa: F401
    ConfigError,
    TrainingError,
    accuracy_reward,
    as_completion,
    check_columns,
    compute_rewards,
    first_line,
    is_conversational,
    load_pretrained,
    load_reward_funcs,
    load_sequence_classifier,
    model_folder_problem,
    reward_weights,
    split_list,
)

# peft reads transformers' deprecated `is_gradient_checkpointing` in every get_peft_model: a FutureWarning the user of
# --use_peft cannot act on
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
# bitsandbytes, which peft imports whenever it is installed, looks at import on an AVX512-BF16 CPU for a faster CPU
# kernel on the Hub (the `kernels` package), and both say so offline; its own CPU kernel runs instead, and a run without
# --load_in_4bit uses neither. In place before that import: this file and the scripts reach transformers' trainer
# utilities, which import peft, as `transformers.<name>` when they run, not when they are imported.
kernel_hint = lambda record: "kernels-community" not in record.getMessage()
for name in ("bitsandbytes.backends.cpu.ops", "kernels._internals.hf_hub"):
    logging.getLogger(name).addFilter(kernel_hint)

ROOT = Path(__file__).resolve().parent
EMBEDDED_MODEL = str(ROOT / "models" / "tiny-arith")
"""The shipped ~1M-parameter warm-start policy (made by `sft.py --from_scratch`); the default everywhere."""


def arg(default, help: str):
    """A dataclass field whose one-line help shows in `--help` (HfArgumentParser reads `metadata["help"]`)."""
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: default, metadata={"help": help})
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass
class Args:
    """The flags the four algorithm scripts share, with TRL's names. A script's `Args(common.Args)` declares its own
    flags and sets its own defaults of these (`max_steps: int = 200`); such a line keeps the help written here."""

    # model and data
    model_name_or_path: str = arg(
        EMBEDDED_MODEL, "policy to train: a hub id or a local folder (default: the embedded tiny model)"
    )
    model_revision: str = arg("main", "branch, tag or commit of --model_name_or_path on the hub")
    trust_remote_code: bool = arg(False, "let a hub model or tokenizer run its own code (its modeling files)")
    attn_implementation: str | None = arg(
        None, "attention kernel: eager, sdpa, flash_attention_2, ... (None: transformers' choice)"
    )
    dataset_name: str = arg(
        "arithmetic", "'arithmetic' (built in), a hub dataset, or a local data file/folder with a 'prompt' column"
    )
    dataset_config: str | None = arg(
        None, "configuration name of a hub dataset or dataset folder with several (load_dataset's `name`)"
    )
    dataset_train_split: str = arg("train", "split to train on")
    dataset_test_split: str = arg("test", "held-out split, scored by the run's reward functions; skipped when absent")
    reward_funcs: list[str] = arg(
        ["accuracy"],
        "reward functions, a list or comma-separated: accuracy (= accuracy_reward), format, think_format_reward, "
        "reasoning_accuracy_reward, get_soft_overlong_punishment, module:function, pkg.module.function, or none",
    )
    reward_weights: list[str] = arg([], "one weight per reward function, a list or comma-separated (default 1.0 each)")
    reward_model_path: str | None = arg(
        None, "a sequence-classification reward model (num_labels=1), added to the rewards"
    )
    disable_dropout: bool = arg(
        True, "turn dropout off (LoRA's too), so sampling, the old log-probs and the loss see one policy"
    )
    # generation
    temperature: float = arg(1.0, "sampling temperature; log-probs use the same logits / temperature")
    top_p: float = arg(1.0, "nucleus sampling (1.0 = off); < 1 is off-policy (log-probs of the full softmax, as TRL)")
    top_k: int = arg(0, "top-k sampling (0 = off); > 0 is off-policy (log-probs of the full softmax, as TRL)")
    max_completion_length: int = arg(24, "max generated tokens per completion")
    chat_template_kwargs: dict | None = arg(
        None, "extra arguments of the chat template, a JSON object such as '{\"enable_thinking\": false}'"
    )
    use_vllm: bool = arg(
        False, "sample with a colocated vLLM engine (needs vllm and a GPU); weights synced after each update"
    )
    vllm_gpu_memory_utilization: float = arg(0.3, "fraction of each GPU's memory the vLLM engine may take")
    vllm_max_model_length: int | None = arg(
        None, "vLLM's context length (default: the model's); lower it to save memory"
    )
    vllm_importance_sampling_correction: bool = arg(
        True, "weight the loss by π_θ_old / π_sampler when vLLM or the --bf16 copy samples (TRL's IS correction)"
    )
    vllm_importance_sampling_mode: str = arg(
        "sequence_mask", "sequence_mask or token_mask (0 above the cap), sequence_truncate or token_truncate (capped)"
    )
    vllm_importance_sampling_clip_max: float = arg(3.0, "the cap C of the importance-sampling ratio")
    # optimization
    prompts_per_step: int = arg(
        16, "distinct prompts per step; the step's batch is prompts_per_step × num_generations completions"
    )
    micro_batch_size: int = arg(0, "completions per forward/backward, gradients accumulated (0 = the whole batch)")
    max_steps: int = arg(200, "training steps (one batch of completions each)")
    learning_rate: float = arg(2e-4, "AdamW learning rate (the embedded model; use ~1e-6 for a full 0.5B model)")
    lr_scheduler_type: str = arg(
        "constant_with_warmup", "transformers scheduler: constant, constant_with_warmup, linear, cosine, ..."
    )
    warmup_ratio: float = arg(0.03, "fraction of optimizer steps spent warming up")
    weight_decay: float = arg(0.0, "AdamW weight decay")
    max_grad_norm: float = arg(1.0, "gradient clipping norm")
    seed: int = arg(0, "random seed (sampling, data order)")
    # logging, evaluation, checkpoints
    logging_steps: int = arg(5, "write metrics every this many steps")
    log_completions: bool = arg(False, "print a few sampled completions with their rewards at each logging step")
    num_completions_to_print: int = arg(2, "how many completions --log_completions prints")
    eval_strategy: str = arg("steps", "'steps': evaluate every eval_steps and at the start and the end; 'no': never")
    eval_steps: int = arg(50, "evaluate on the held-out split every this many steps (also at the start and the end)")
    num_generations_eval: int = arg(4, "completions sampled per held-out prompt for the evaluation")
    per_device_eval_batch_size: int = arg(512, "completions per generate call during evaluation")
    output_dir: str = arg("outputs/run", "where metrics.jsonl, checkpoints and the final model go")
    save_steps: int = arg(100, "save a checkpoint every this many steps (0 = never; Ctrl-C, SIGTERM always save)")
    save_total_limit: int | None = arg(
        None, "keep only the newest N checkpoints (None: all); never deletes the one the run resumed from"
    )
    resume_from_checkpoint: str | None = arg(None, "a checkpoint folder, or 'latest' (newest complete in output_dir)")
    overwrite_output_dir: bool = arg(False, "start over in an output_dir of another run (deletes its checkpoints)")
    # efficiency
    use_peft: bool = arg(False, "train a LoRA adapter; the reference model is then the policy with adapters disabled")
    lora_r: int = arg(16, "LoRA rank")
    lora_alpha: int = arg(32, "LoRA alpha")
    lora_dropout: float = arg(0.05, "LoRA dropout")
    lora_target_modules: list[str] = arg(["all-linear"], "module names (q_proj v_proj or q_proj,v_proj) or all-linear")
    save_merged_model: bool = arg(False, "with --use_peft, also save the merged model in output_dir/merged")
    load_in_4bit: bool = arg(False, "QLoRA: the frozen base in 4 bits (bitsandbytes), the LoRA adapter in float32")
    bnb_4bit_quant_type: str = arg("nf4", "4-bit data type of --load_in_4bit: nf4 or fp4")
    use_bnb_nested_quant: bool = arg(False, "with --load_in_4bit, also quantize the quantization constants")
    gradient_checkpointing: bool = arg(False, "recompute activations in the backward pass to save memory")
    bf16: bool = arg(False, "bfloat16 autocast for forward passes")
    report_to: list[str] = arg(
        ["none"], "trackers besides metrics.jsonl: none, all, or accelerate's (tensorboard, wandb, trackio, ...)"
    )


def parse_args(args_class, argv=None):
    """`args_class` from the command line. Prefixes of flags are not accepted (`--num_generation` is not
    `--num_generations_eval`); an unknown flag or a value of the wrong type is a ConfigError naming the flag. Only the
    command line counts: no `<script>.args` file next to the script is read (HfArgumentParser's default).

    `--config FILE` reads flags from a YAML (or JSON) file (`config_flags`); flags on the command line override it. A
    dict-typed field (--chat_template_kwargs) takes a JSON object."""
    helps = {f.name: f.metadata["help"] for f in dataclasses.fields(Args)}
    for field in dataclasses.fields(args_class):  # `max_steps: int = 200` in a script keeps common.Args' help
        field.metadata = field.metadata or {"help": helps.get(field.name, "")}
    parser = HfArgumentParser(args_class, allow_abbrev=False)
    parser.add_argument(  # for --help only: the file is read below, before parsing
        "--config", metavar="FILE", default=argparse.SUPPRESS, help=CONFIG_HELP
    )
    for action in parser._actions:  # HfArgumentParser would call dict('{"a": 1}')
        if action.type is dict:
            action.type = json_object

    def error(message: str):  # argparse's "argument --flag/--flag-alias: invalid int value: 'x'" -> "--flag: ..."
        raise ConfigError(re.sub(r"^argument (--[^/:]+)(/[^:]*)?: ", r"\1: ", message))

    parser.error = error
    argv, config = without_config(sys.argv[1:] if argv is None else list(argv))
    if config is not None:
        argv = config_flags(config, args_class) + argv  # before the command line, whose flags then win
    args, unknown = parser.parse_args_into_dataclasses(
        args=argv, return_remaining_strings=True, look_for_args_file=False
    )
    if unknown:
        flags = [f"--{field.name}" for field in dataclasses.fields(args_class)]
        close = difflib.get_close_matches(unknown[0].split("=")[0], flags, n=1)
        hint = f" (did you mean {close[0]}?)" if close else " (--help lists the flags)"
        require(not unknown[0].startswith("-"), f"{unknown[0]}: unknown flag{hint}")
        raise ConfigError(f"{unknown[0]}: unexpected argument")
    return args


CONFIG_HELP = (
    "a YAML (or JSON) file of flag: value, such as a run's output_dir/args.json; flags on the command line override it"
)


def without_config(argv: list[str]) -> tuple[list[str], str | None]:
    """The command line without its `--config FILE` (or `--config=FILE`), and FILE (None without one)."""
    rest, config, tokens = [], None, iter(argv)
    for token in tokens:
        if token == "--config":
            config = next(tokens, None)
            require(config is not None, "--config: expected a file")
        elif token.startswith("--config="):
            config = token.removeprefix("--config=")
        else:
            rest.append(token)
    return rest, config


def config_flags(path: str, args_class) -> list[str]:
    """The flags a --config file sets, as command-line tokens, so that argparse checks their types as it checks the
    command line's: the file is a mapping of flag names (TRL's YAML recipes, or a run's args.json) to values; a list is
    several values, a mapping a JSON object, and null leaves the flag at its default. An `env` mapping sets environment
    variables, as TRL's does. A key that is no flag, or a file that is not such a mapping, is one line."""
    try:
        config = yaml.safe_load(Path(path).expanduser().read_text())
    except OSError as error:
        raise ConfigError(f"--config: cannot read {path}: {error.strerror or error}") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise ConfigError(f"--config {path}: not YAML{where}: {getattr(error, 'problem', None) or error}") from None
    require(
        isinstance(config, dict), f"--config {path}: expected a mapping of flag: value, got {type(config).__name__}"
    )
    env = config.pop("env", None) or {}
    require(isinstance(env, dict), f"--config {path}: env: expected a mapping of variable: value")
    os.environ.update({str(name): str(value) for name, value in env.items()})
    names = [field.name for field in dataclasses.fields(args_class)]
    text = lambda v: json.dumps(v) if isinstance(v, dict) else str(v).lower() if isinstance(v, bool) else str(v)
    tokens = []
    for key, value in config.items():
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean --{close[0]}?)" if close else " (--help lists the flags)"
            raise ConfigError(f"--config {path}: unknown key {key!r}{hint}")
        if isinstance(value, list):
            tokens += [f"--{key}", *map(text, value)] if value else []
        elif value is not None:
            tokens.append(f"--{key}={text(value)}")  # one token: a value may start with "-"
    return tokens


def json_object(text: str) -> dict:
    """argparse's type for a dict-typed flag: a JSON object."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f"expected a JSON object such as '{{\"enable_thinking\": false}}', got {text!r}"
        )
    return value


def cli(main, args_class, argv=None):
    """Parse `args_class` from the command line and run `main(args)`. A ConfigError (bad input, or a TrainingError) is
    one line `error: ...` on stderr, on a line of its own, and exit status 2. Ctrl-C or SIGTERM outside a training step
    (loading, the first or the final evaluation; or a second signal) stops at once: one line saying what was kept, and
    exit status 130 (SIGINT) or 143 (SIGTERM). The run's lock on --output_dir is released however main ends."""
    try:
        args = parse_args(args_class, argv)
    except ConfigError as error:
        exit_with_error(error)
    output_dir = getattr(args, "output_dir", None)
    started = time.time()
    with signals_stop_at_once() as received:
        try:
            main(args)
            close_process_group()
        except NonFiniteError as error:  # nothing saved from this step: say which checkpoint the run keeps
            exit_with_error(ConfigError(f"{error}; {newest_checkpoint_kept(output_dir)}"))
        except ConfigError as error:
            exit_with_error(error)
        except KeyboardInterrupt:
            for signum in STOP_SIGNALS:  # already stopping: a third signal must not cut the line or keep the lock
                signal.signal(signum, signal.SIG_IGN)
            close_progress_bars()
            signum = received[0] if received else signal.SIGINT
            print(stopped_at_once(signum, output_dir, started), file=sys.stderr)
            sys.exit(128 + signum)
        finally:
            if output_dir is not None:
                release_output_dir(output_dir)


def close_process_group():
    """End a multi-process run: free the loop's DDP wrappers (main has returned; `gc.collect` breaks its closures'
    reference cycles), then destroy the process group. In this order, and not with `accelerator.end_training()` at the
    end of the loop: a DDP wrapper freed after the group holds its last reference and destroys gloo's worker threads
    while holding the GIL, which a worker may still need to release the tensors of the loop's last collective. That is
    a hang at exit, one run in a few under CPU load (pytorch/pytorch#56297); the group's own destructor releases the
    GIL."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        gc.collect()
        torch.distributed.destroy_process_group()


def exit_with_error(error: ConfigError):
    close_progress_bars()  # so that the line starts on a line of its own, not after a progress bar
    message = " ".join(str(error).split()) or type(error).__name__
    sys.stderr.write(f"error: {message}\n")  # one write: under `accelerate launch` each process's line stays whole
    sys.stderr.flush()
    sys.exit(2)


def close_progress_bars():
    for bar in list(getattr(tqdm, "_instances", [])):  # tqdm's own registry of open bars
        bar.close()


def require(condition: bool, message: str):
    if not condition:
        raise ConfigError(message)


IS_MODES = ("sequence_mask", "sequence_truncate", "token_mask", "token_truncate")  # TRL's importance-sampling modes


def check_shared_args(args):
    """The flags several scripts share, each checked here once so that the wording is the same everywhere; a script's
    `check_args` calls this first, then checks its own. Only the fields `args` has are checked."""

    def check(name: str, condition, expected: str):
        if hasattr(args, name):
            value = getattr(args, name)
            require(condition(value), f"--{name}: must be {expected}, got {value}")

    for name in (
        "learning_rate",
        "max_steps",
        "prompts_per_step",
        "logging_steps",
        "per_device_eval_batch_size",
        "num_generations_eval",
        "max_completion_length",
        "temperature",
        "max_grad_norm",
        "lora_r",
        "lora_alpha",
        "epsilon",
    ):
        check(name, lambda value: value > 0, "positive")
    for name in ("micro_batch_size", "eval_steps", "save_steps", "weight_decay", "top_k", "num_completions_to_print"):
        check(name, lambda value: value >= 0, "≥ 0")
    check("num_iterations", lambda value: value >= 1, "≥ 1")
    check("beta", lambda value: value >= 0, "≥ 0")
    check("epsilon_high", lambda value: value is None or value > 0, "positive")
    check("kl_estimator", lambda value: value in ("k1", "k3"), "k1 or k3")
    check("top_p", lambda value: 0 < value <= 1, "in (0, 1] (1.0 = off)")
    check("eval_strategy", lambda value: value in ("steps", "no"), "steps or no")
    check("warmup_ratio", lambda value: 0 <= value <= 1, "in [0, 1]")
    check("lora_dropout", lambda value: 0 <= value < 1, "in [0, 1)")
    check("vllm_max_model_length", lambda value: value is None or value > 0, "positive")
    check("vllm_importance_sampling_mode", lambda value: value in IS_MODES, f"one of {', '.join(IS_MODES)}")
    check("vllm_importance_sampling_clip_max", lambda value: value > 0, "positive")
    check("lora_target_modules", lambda value: bool(split_list(value)), "module names or all-linear")
    check("save_total_limit", lambda value: value is None or value > 0, "positive (or unset: keep every checkpoint)")
    check("bnb_4bit_quant_type", lambda value: value in ("nf4", "fp4"), "nf4 or fp4")
    if getattr(args, "load_in_4bit", False):
        require(args.use_peft, "--load_in_4bit: the 4-bit base is frozen, only a LoRA adapter trains: add --use_peft")
        require(
            importlib.util.find_spec("bitsandbytes") is not None,
            "--load_in_4bit: the bitsandbytes package is not installed (pip install bitsandbytes)",
        )
        require(
            not getattr(args, "use_vllm", False),
            "--use_vllm: not with --load_in_4bit (vLLM is sent the policy's weights after each update, and a 4-bit "
            "base has no full-precision weights to send)",
        )
    schedulers = {s.value for s in transformers.SchedulerType}
    require(args.lr_scheduler_type in schedulers, f"--lr_scheduler_type: unknown scheduler {args.lr_scheduler_type!r}")
    tracker_names(args.report_to)  # an unknown tracker or a missing package stops here, before anything loads
    if getattr(args, "reward_clip_range", None) is not None:
        require(len(args.reward_clip_range) == 2, "--reward_clip_range: expected two numbers, low and high")
        low, high = args.reward_clip_range
        require(low <= high, f"--reward_clip_range: expected low ≤ high, got {low} {high}")
    # held-out figures must come from prompts the run never trains on
    require(
        args.dataset_train_split != args.dataset_test_split,
        f"--dataset_test_split: {args.dataset_test_split!r} "
        "is also --dataset_train_split: the held-out figures would come from training data",
    )
    require(
        args.dataset_name != "arithmetic" or args.dataset_train_split == "train",
        "--dataset_train_split: the "
        f"built-in arithmetic task trains on 'train' (the rest is held out), got {args.dataset_train_split!r}",
    )
    check_output_dir(args)


def check_output_dir(args):
    """--output_dir is, or can become, a writable folder; --overwrite_output_dir and --resume_from_checkpoint exclude
    each other."""
    out = Path(args.output_dir)
    existing = next(path for path in (out, *out.parents) if path.exists())
    require(existing.is_dir(), f"--output_dir: {existing} is a file, not a folder")
    require(os.access(existing, os.W_OK | os.X_OK), f"--output_dir: {existing} is not writable")
    require(
        not (args.overwrite_output_dir and args.resume_from_checkpoint),
        "--overwrite_output_dir: starts over, which contradicts --resume_from_checkpoint (pick one)",
    )
    used = another_runs_files(args)
    require(not used or args.overwrite_output_dir, used_folder_message(args, used))  # again when claimed, to be sure


# ----------------------------------------------------------------------------------------------------------------------
# Stopping: a signal ends a run after its current step, with a checkpoint; checkpoints are never half-written
# ----------------------------------------------------------------------------------------------------------------------
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # Ctrl-C, and what Slurm, Kubernetes and most schedulers send first


@contextlib.contextmanager
def graceful_interrupt():
    """Ctrl-C (SIGINT) or SIGTERM sets the yielded event instead of stopping the process: the loop finishes its step,
    saves a checkpoint and exits with 128 + the signal's number (`stop_early`). A second signal stops at once, except
    while a checkpoint is being written (`signals_deferred`). A TrainingError raised in the loop ends it too, kept as
    `event.error`, so that the script saves a checkpoint before reporting it; a NonFiniteError passes through, since
    the weights it stops are not worth one."""
    event = threading.Event()
    event.signum, event.error = None, None
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}

    def handler(signum, frame):
        event.signum = event.signum or signum
        event.set()
        for restored, action in previous.items():  # a second signal stops at once
            signal.signal(restored, action)

    for signum in STOP_SIGNALS:
        signal.signal(signum, handler)
    try:
        yield event
    except NonFiniteError:  # the weights are not worth a checkpoint: stop at once
        raise
    except TrainingError as error:
        event.error = error
    finally:
        for signum, action in previous.items():
            signal.signal(signum, action)


@contextlib.contextmanager
def signals_stop_at_once():
    """SIGTERM stops the process as Ctrl-C does, with a KeyboardInterrupt (not silently, by the default action), so
    that `cli` says what was kept and releases the lock; the yielded list collects the signals received. Inside the
    training loop `graceful_interrupt` takes over, and hands back to this after the first signal."""
    received = []
    if threading.current_thread() is not threading.main_thread():  # only the main thread can handle signals
        yield received
        return

    def stop(signum, frame):
        received.append(signum)
        raise KeyboardInterrupt

    previous = {signum: signal.signal(signum, stop) for signum in STOP_SIGNALS}
    try:
        yield received
    finally:
        for signum, action in previous.items():
            signal.signal(signum, action)


def stopped_at_once(signum: int, output_dir: str | None, started: float) -> str:
    """The line of a run stopped at once by `signum`: what it kept. The final model is saved before the final
    evaluation, so a model written since the run `started` means that only the evaluation's figures are lost."""
    name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
    if output_dir is not None:
        model_files = [Path(output_dir) / file for file in ("config.json", "adapter_config.json")]
        if any(path.is_file() and path.stat().st_mtime >= started for path in model_files):
            return (
                f"stopped at once by {name}: the trained model is saved in {output_dir}; only the final evaluation "
                "is lost"
            )
    return f"stopped at once by {name}: the checkpoints in {output_dir} are complete (never half-written)"


@contextlib.contextmanager
def signals_deferred():
    """Hold SIGINT and SIGTERM until the block ends, then deliver them to whatever handles them after it: a checkpoint
    or the final model is always written whole, and the previous one is never deleted before it is."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread can handle signals
        yield
        return
    received = []
    previous = {signum: signal.signal(signum, lambda signum, frame: received.append(signum)) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, action in previous.items():
            signal.signal(signum, action)
        for signum in received:
            signal.raise_signal(signum)


def stop_early(accelerator: Accelerator, stopped: threading.Event, step: int, checkpoint: Path):
    """The end of a run whose loop stopped before max_steps, once `checkpoint` is saved: the line that says why and how
    to continue, then exit status 128 + the signal's number (130 for Ctrl-C, 143 for SIGTERM), or the TrainingError's
    line and status 2."""
    if stopped.error is not None:
        at = getattr(stopped.error, "step", step + 1)  # a failed log names its step; a reward fails in the next
        raise TrainingError(
            f"{stopped.error} (at step {at}); saved {checkpoint}: after fixing it, continue with "
            "--resume_from_checkpoint latest"
        )
    accelerator.print(f"interrupted at step {step}: saved {checkpoint}; continue with --resume_from_checkpoint latest")
    raise SystemExit(128 + (stopped.signum or signal.SIGINT))


class NonFiniteError(TrainingError):
    """Training that is no longer finite (`check_finite`): the run stops at that step and saves nothing of it."""


def check_finite(accelerator: Accelerator | PartialState, step: int, **values):
    """Stop the run at `step` when one of `values` (name -> number or tensor: the loss, the gradient norm, the rewards)
    is not finite on any process, before the optimizer applies it. A diverged run does not go on sampling from NaN
    weights, and its weights are saved neither as a checkpoint nor as the final model: `cli` says which checkpoint
    is the newest kept. Every process must call it (one all-reduce of one number)."""
    bad = [name for name, value in values.items() if not torch.isfinite(torch.as_tensor(value)).all()]
    if any_process(accelerator, bool(bad)):
        what = ", ".join(name.replace("_", " ") for name in bad) or "a value on another process"
        raise NonFiniteError(
            f"step {step}: not finite: {what} (training diverged: too high a --learning_rate?); the weights of this "
            "step are not saved"
        )


def newest_checkpoint_kept(output_dir: str | None) -> str:
    """The end of the line of a run that stops without saving: its newest complete checkpoint, or that it has none."""
    found = [p for p in Path(output_dir or ".").glob("checkpoint-*") if CHECKPOINT_NAME.fullmatch(p.name)]
    complete = [p for p in found if checkpoint_problem(p) is None]
    if not complete:
        return f"no checkpoint was saved in {output_dir} (--save_steps)"
    newest = max(complete, key=lambda p: int(p.name.split("-")[1]))
    return f"the newest checkpoint, {newest}, is kept (--resume_from_checkpoint latest)"


# ----------------------------------------------------------------------------------------------------------------------
# Processes: every script runs as one process, or as N under `accelerate launch` (DDP, DeepSpeed, FSDP)
# ----------------------------------------------------------------------------------------------------------------------
def make_accelerator(args) -> Accelerator:
    """accelerate's Accelerator: one process, or whatever `accelerate launch` set up (`check_launch`), with
    metrics.jsonl and the --report_to trackers (`MetricsLogger` starts them). `--bf16` forces bf16 autocast; otherwise
    the launch config's mixed precision applies. Under DeepSpeed, which clips inside `backward`, --max_grad_norm sets
    the engine's `gradient_clipping`, over any a launch config gives."""
    accelerator = Accelerator(
        mixed_precision="bf16" if args.bf16 else None,
        log_with=[MetricsFile(args.output_dir), *tracker_names(args.report_to)],  # started by MetricsLogger
        project_config=ProjectConfiguration(logging_dir=str(Path(args.output_dir) / "runs")),  # tensorboard's, aim's
    )
    check_launch(accelerator)
    map_large_blocks()
    if accelerator.state.deepspeed_plugin is not None:
        # no DataLoader is prepared, so DeepSpeed's batch bookkeeping gets its numbers here: one backward per update
        accelerator.state.deepspeed_plugin.deepspeed_config.update(
            train_micro_batch_size_per_gpu=1,
            gradient_accumulation_steps=1,
            train_batch_size=accelerator.num_processes,
            gradient_clipping=args.max_grad_norm,
        )
    return accelerator


def check_launch(accelerator: Accelerator):
    """Stop when accelerate set up something other than what `accelerate launch` started, which its environment says
    (WORLD_SIZE, ACCELERATE_USE_DEEPSPEED, ACCELERATE_USE_FSDP). accelerate replaces what it cannot honour silently:
    without a GPU, DeepSpeed and FSDP, and DDP unless ACCELERATE_USE_CPU=1, become N independent one-process runs
    writing into one folder."""
    launched = get_int_from_env(["WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"], 1)
    backends = {"ACCELERATE_USE_DEEPSPEED": DistributedType.DEEPSPEED, "ACCELERATE_USE_FSDP": DistributedType.FSDP}
    wanted = [backend for variable, backend in backends.items() if os.environ.get(variable, "").lower() == "true"]
    got, n = accelerator.distributed_type, accelerator.num_processes
    require(
        n == launched and all(backend == got for backend in wanted),
        f"accelerate launch: started {''.join(f'{b.value} on ' for b in wanted)}{launched} processes, but accelerate "
        f"set up distributed type {got.value} on {n} (DeepSpeed and FSDP need a GPU per process; DDP on CPUs: "
        "ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes N)",
    )


def prepare_frozen(accelerator: Accelerator, model):
    """A model no optimizer updates (the reference, a reward model): in eval mode, without gradients, on this process's
    device. Under DeepSpeed ZeRO-3 transformers partitions every model loaded after the Accelerator, so a frozen one is
    wrapped in an engine for inference, without an optimizer, which gathers each layer's parameters for its forward (as
    TRL does); under ZeRO-1/2 and FSDP it stays whole on every process."""
    model = model.eval().requires_grad_(False)
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None or plugin.zero_stage != 3:
        return model.to(accelerator.device)
    import deepspeed

    zero = {key: value for key, value in plugin.deepspeed_config["zero_optimization"].items() if value != "auto"}
    config = {**plugin.deepspeed_config, "zero_optimization": zero}  # DeepSpeed's own bucket sizes for "auto" ones
    engine = deepspeed.initialize(model=model, config=config)[0]
    engine.eval()  # DeepSpeed's returns None
    return engine


def prepare(accelerator: Accelerator, *objects):
    """`accelerator.prepare`, without the wrapper accelerate puts on a model's forward under mixed precision: autocast
    plus a float32 copy of every output, which for a causal LM is a float32 (B, T, V) copy of the logits. The scripts
    enter autocast themselves (`accelerator.autocast()`), and `completion_logprobs` upcasts the bf16 logits one chunk at
    a time."""
    prepared = accelerator.prepare(*objects)
    for obj in prepared if isinstance(prepared, tuple) else (prepared,):
        if isinstance(obj, torch.nn.Module):
            accelerator.unwrap_model(obj, keep_fp32_wrapper=False)  # puts the model's own forward back, in place
    return prepared


def shard(accelerator: Accelerator, total: int, flag: str) -> slice:
    """This process's contiguous share of `total` items (prompts of a step, sequences of a batch)."""
    n = accelerator.num_processes
    require(total % n == 0, f"{flag}: {total} is not divisible by the {n} processes")
    return slice(accelerator.process_index * total // n, (accelerator.process_index + 1) * total // n)


def process_share(accelerator: Accelerator, args, G: int, mini_batches: int = 1) -> tuple[slice, int, int]:
    """This process's share of each step: its slice of the prompts_per_step prompts, its number of completions (whole
    groups of G, so that a baseline never needs another process's rewards), and the completions per forward and
    backward (--micro_batch_size; 0: all of them at once, which DeepSpeed requires: `check_backend`). ppo.py updates
    on `mini_batches` mini-batches of the share (--num_mini_batches), each accumulated from micro-batches."""
    my_prompts = shard(accelerator, args.prompts_per_step, "--prompts_per_step")
    local_batch_size = args.prompts_per_step * G // accelerator.num_processes
    of_each = f" of each of the {accelerator.num_processes} processes" if accelerator.num_processes > 1 else ""
    require(
        local_batch_size % mini_batches == 0,
        f"--num_mini_batches: {mini_batches} does not divide the batch of {local_batch_size} completions{of_each}",
    )
    mini_batch_size = local_batch_size // mini_batches
    micro_batch_size = args.micro_batch_size or mini_batch_size
    batch = "mini-batch" if mini_batches > 1 else "batch"
    require(
        mini_batch_size % micro_batch_size == 0,
        f"--micro_batch_size: {micro_batch_size} does not divide the {batch} of {mini_batch_size} completions{of_each}",
    )
    check_backend(accelerator, micro_batch_size == local_batch_size)
    return my_prompts, local_batch_size, micro_batch_size


def any_process(accelerator: Accelerator | PartialState, flag: bool) -> bool:
    """True when `flag` is set on any process (a Ctrl-C seen by one rank stops them all at the same step). Every
    process must call it."""
    if accelerator.num_processes == 1:
        return flag
    return bool(reduce_over_processes(torch.tensor(float(flag), device=accelerator.device), "sum").item() > 0)


def check_backend(accelerator: Accelerator, one_backward_per_update: bool):
    """DeepSpeed takes its optimizer step inside `backward`: there an update must be a single backward pass."""
    require(
        one_backward_per_update or accelerator.distributed_type != DistributedType.DEEPSPEED,
        "--micro_batch_size: under DeepSpeed each update is one backward pass: leave it 0 (the per-process batch)",
    )


@contextlib.contextmanager
def generation_model(accelerator: Accelerator, model, sampler=None):
    """The plain model for `generate`, without the DDP wrapper; with a bf16 `sampler` (`bf16_sampler`), that copy,
    refreshed from the policy's weights first. Under DeepSpeed ZeRO-3 the parameters are gathered for the duration (as
    TRL does), so generation runs without a collective per token; under FSDP2 the module is its own unwrapped model and
    transformers keeps the ranks in step (`synced_gpus`)."""
    unwrapped = accelerator.unwrap_model(model)
    if sampler is not None:
        sync_sampler(sampler, unwrapped)
        yield sampler
    elif (
        accelerator.distributed_type == DistributedType.DEEPSPEED and accelerator.state.deepspeed_plugin.zero_stage == 3
    ):
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(model.parameters())):
            yield unwrapped
    else:
        yield unwrapped


# ----------------------------------------------------------------------------------------------------------------------
# --bf16: fp32 master weights and optimizer state, bf16 matrix multiplications
#
# - the policy's forward and backward run under bf16 autocast (`accelerator.autocast()`, mixed precision): its weights,
#   gradients and AdamW state stay float32, so that small updates are not lost to bf16's 8-bit mantissa;
# - the frozen models (the reference; with LoRA the base weights) are loaded in bf16 once: nothing to update;
# - sampling runs on a bf16 copy of the policy (`bf16_sampler`), refreshed from the float32 weights before each
#   generation, as vLLM's weights are after each update: autocast would cast every weight at every decoded token;
# - log-probs, the KL and every loss reduction are float32 (`completion_logprobs` upcasts the bf16 logits).
# ----------------------------------------------------------------------------------------------------------------------
def bf16_sampler(accelerator: Accelerator, model, args):
    """With --bf16, a bfloat16 copy of the policy to sample from; None without --bf16, with --use_vllm (vLLM samples),
    with --use_peft (the frozen base is bf16 already: the policy samples itself), and under DeepSpeed ZeRO-3 or FSDP,
    whose sharded weights the policy gathers itself (it then samples under autocast)."""
    sharded = accelerator.distributed_type == DistributedType.FSDP or (
        accelerator.distributed_type == DistributedType.DEEPSPEED and accelerator.state.deepspeed_plugin.zero_stage == 3
    )
    if not args.bf16 or args.use_vllm or args.use_peft or sharded:
        return None
    policy = accelerator.unwrap_model(model)
    sampler = load_causal_lm(args.model_name_or_path, dtype=torch.bfloat16, **loading_options(args))
    sampler = sampler.to(accelerator.device)
    sampler.eval().requires_grad_(False)
    sync_sampler(sampler, policy)  # a resumed run's weights are the policy's, not the checkpoint's on disk
    return sampler


@torch.no_grad()
def sync_sampler(sampler, policy):
    """Copy the policy's float32 weights into the bf16 sampler, rounding each to bf16 (one pass over the weights)."""
    for copy, weight in zip(sampler.parameters(), policy.parameters(), strict=True):
        copy.copy_(weight)


# ----------------------------------------------------------------------------------------------------------------------
# The built-in task: one-digit arithmetic, answered as <answer>N</answer>.
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
    """Conversational prompts (one user turn) with a `ground_truth` column, the format TRL's trainers take."""
    rows = [
        {"prompt": [{"role": "user", "content": arithmetic_question(a, op, b)}], "ground_truth": str(answer)}
        for a, op, b, answer in arithmetic_split(split)
    ]
    return Dataset.from_list(rows)


# ----------------------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------------------
FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


def load_split(
    dataset_name: str,
    split: str,
    builtin: dict | None = None,
    flag: str = "--dataset_name",
    columns: tuple[str, ...] = ("prompt",),
    config: str | None = None,
) -> Dataset | None:
    """One split of a dataset: a built-in name (its splits are 'train' and 'test'), a local data file, a local folder,
    or a hub dataset name, of its configuration `config` (--dataset_config, load_dataset's `name`) when it has several.
    A single local file is its 'train' split. Returns None when the split does not exist. The text `columns` the script
    reads are checked row by row (`usable_rows`)."""
    path = Path(dataset_name)
    require(
        config is None or not ((builtin and dataset_name in builtin) or path.suffix in FILE_BUILDERS),
        f"--dataset_config: {dataset_name} has no configurations (only a hub dataset or a dataset folder has)",
    )
    if builtin and dataset_name in builtin:
        return builtin[dataset_name](split) if split in ("train", "test") else None
    if path.suffix in FILE_BUILDERS:
        require(path.is_file(), f"{flag}: no such file: {dataset_name}")
        if split != "train":
            return None
        require(path.stat().st_size > 0, f"{flag}: {dataset_name} is empty")
        try:
            dataset = load_dataset(FILE_BUILDERS[path.suffix], data_files=str(path), split="train")
        except Exception as error:  # a malformed or empty file: say which flag and file
            raise ConfigError(f"{flag}: cannot read {dataset_name}: {first_line(error)}") from None
    else:
        if dataset_name.startswith((".", "/", "~")) or path.exists():
            require(path.is_dir(), f"{flag}: no such file or folder: {dataset_name}")
        cache = {"cache_dir": local_cache(path)} if path.is_dir() else {}
        try:  # a hub dataset name or a local folder of data files: the same datasets call serves both
            if split not in get_dataset_split_names(dataset_name, config, **cache):
                return None
            dataset = load_dataset(dataset_name, config, split=split, **cache)
        except Exception as error:
            reason = first_line(error)
            if config is not None:
                raise ConfigError(f"--dataset_config: cannot load {config!r} of {dataset_name!r}: {reason}") from None
            hint = " (choose one with --dataset_config)" if "config" in reason.lower() else ""
            raise ConfigError(f"{flag}: cannot load {dataset_name!r}: {reason}{hint}") from None
    require(len(dataset) > 0, f"{flag}: the {split!r} split of {dataset_name} has no rows")
    dataset = usable_rows(dataset, split, columns, flag)
    require(
        len(dataset) > 0, f"{flag}: the {split!r} split of {dataset_name} has no usable row (every row was skipped)"
    )
    return dataset


def local_cache(folder: Path) -> str:
    """A datasets cache of a local dataset folder's own, new whenever one of its files changes. datasets keys the cache
    of a folder with a dataset card naming its files (the hub's layout) on the folder's name alone: another folder of
    that name, or this one edited, would be read from a stale copy."""
    files = sorted(f for f in folder.rglob("*") if f.is_file())
    stamps = repr([(str(f.resolve()), f.stat().st_mtime_ns, f.stat().st_size) for f in files])
    return str(Path(datasets_config.HF_DATASETS_CACHE) / "local" / hashlib.sha256(stamps.encode()).hexdigest()[:16])


ROLES = ("system", "developer", "user", "assistant", "tool")


def usable_rows(dataset: Dataset, split: str, columns: tuple[str, ...], flag: str = "--dataset_name") -> Dataset:
    """The rows of `dataset` a script can train on, its text `columns` (those it has) read as TRL reads them: a string,
    or a conversation, a list of {"role", "content"} messages with string content. A row that means nothing (a
    number, a message without a role or content, an unknown role, a prompt that ends with the system's turn, a
    completion that does not end with the assistant's, a string prompt with a conversational completion) stops the
    run with one line naming the column, the split and the row. A row with nothing to train on (None, a text or a
    conversation that is empty or whitespace, chosen equal to rejected) is skipped, and one line says how many."""
    present = [column for column in columns if column in dataset.column_names]
    skipped = {}  # why -> row indices
    for i, values in enumerate(zip(*(dataset[column] for column in present))):
        row = dict(zip(present, values))
        blank = [
            column
            for column, value in row.items()
            if is_blank(value, f"{flag}: {column!r} of row {i} of the {split!r} split", completion=column != "prompt")
        ]
        for column in ("completion", "chosen", "rejected"):
            if column in row and "prompt" in row and not {column, "prompt"} & set(blank):
                require(
                    isinstance(row["prompt"], str) == isinstance(row[column], str),
                    f"{flag}: row {i} of the {split!r} split: 'prompt' and {column!r} must both be strings or both "
                    "lists of messages",
                )
        if blank:
            skipped.setdefault(f"an empty {blank[0]!r}", []).append(i)
        elif "chosen" in row and row.get("chosen") == row.get("rejected"):
            skipped.setdefault("chosen equal to rejected", []).append(i)
    if skipped:
        reasons = ", ".join(
            f"{len(rows)} with {why} (row {rows[0]}{', ...' if len(rows) > 1 else ''})" for why, rows in skipped.items()
        )
        dropped = {i for rows in skipped.values() for i in rows}
        print(f"{flag}: skipping {len(dropped)} of {len(dataset)} rows of the {split!r} split: {reasons}")
        dataset = dataset.select([i for i in range(len(dataset)) if i not in dropped])
    return dataset


def is_blank(value, where: str, completion: bool) -> bool:
    """Whether a text column's value holds no text (None, whitespace, a conversation without any); a ConfigError when
    it is neither a string nor a conversation the chat template can render."""
    if value is None or isinstance(value, str):
        return value is None or not value.strip()
    require(isinstance(value, list), f"{where}: expected a string or a list of messages, got {type(value).__name__}")
    for k, message in enumerate(value):
        missing = [key for key in ("role", "content") if not isinstance(message, dict) or key not in message]
        require(
            not missing,
            f"{where}: message {k} has no {' or '.join(missing)} (expected {{'role': ..., 'content': ...}})",
        )
        require(
            message["role"] in ROLES,
            f"{where}: message {k} has the unknown role {message['role']!r} (known: {', '.join(ROLES)})",
        )
        content = message["content"]
        require(
            isinstance(content, str), f"{where}: message {k} has {type(content).__name__} content, expected a string"
        )
    if value and completion:
        require(
            value[-1]["role"] == "assistant", f"{where}: ends with the {value[-1]['role']}'s turn, not the assistant's"
        )
    elif value:
        require(
            value[-1]["role"] in ("user", "tool", "assistant"),
            f"{where}: ends with the {value[-1]['role']}'s turn: nothing to answer (a prompt ends with the user's "
            "turn, or the assistant's, which is continued)",
        )
    return not any(message["content"].strip() for message in value)


def rows_of_step(dataset: Dataset, step: int, prompts_per_step: int, seed: int, my_share: slice) -> Dataset:
    """This process's share of the prompts of `step` (numbered from 1). The position in the data is a function of the
    step (a fresh permutation each epoch), so a resumed run sees the prompts the uninterrupted run would have."""
    epoch, position = divmod(step - 1, len(dataset) // prompts_per_step)
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed + epoch))
    return dataset.select(order[position * prompts_per_step : (position + 1) * prompts_per_step][my_share].tolist())


def check_prompt_column(dataset: Dataset, flag: str = "--dataset_name"):
    require(
        "prompt" in dataset.column_names,
        f"{flag}: the dataset has no 'prompt' column (columns: {dataset.column_names})",
    )


def check_prompt_lengths(
    tokenizer,
    model,
    max_completion_length: int,
    datasets: dict,
    vllm_max_model_length: int | None = None,
    chat_template_kwargs: dict | None = None,
):
    """Stop with one line, before anything runs, when a prompt followed by max_completion_length tokens does not fit the
    model's context (`config.max_position_embeddings`; a model without one is not checked), or vLLM's
    (`vllm_max_model_length`, under --use_vllm), which would cut a completion short with no end token. `datasets`:
    split -> Dataset with a 'prompt' column, or None."""
    context = getattr(model.config, "max_position_embeddings", None)
    if context is None:
        return
    require(
        max_completion_length < context,
        f"--max_completion_length: {max_completion_length} tokens do not fit "
        f"the model's context of {context} (max_position_embeddings)",
    )
    for split, dataset in datasets.items():
        if dataset is None:
            continue
        texts = [prompt_text(tokenizer, prompt, chat_template_kwargs) for prompt in dataset["prompt"]]
        lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False).input_ids]
        longest = max(range(len(lengths)), key=lengths.__getitem__)
        where = f"prompt {longest} of the {split!r} split is {lengths[longest]} tokens"
        require(lengths[longest] < context, f"--dataset_name: {where}, more than the model's context of {context}")
        require(
            lengths[longest] + max_completion_length <= context,
            f"--max_completion_length: {where}; with "
            f"{max_completion_length} more it exceeds the model's context of {context}",
        )
        require(
            vllm_max_model_length is None or lengths[longest] + max_completion_length <= vllm_max_model_length,
            f"--vllm_max_model_length: {vllm_max_model_length} tokens do not hold the longest prompt and "
            f"--max_completion_length {max_completion_length} ({where}): vLLM would cut completions short",
        )


def check_max_length(model, max_length: int):
    """--max_length (of training sequences) fits the model's context (`config.max_position_embeddings`, if any)."""
    context = getattr(model.config, "max_position_embeddings", None)
    require(
        context is None or max_length <= context,
        f"--max_length: {max_length} exceeds the model's context of {context} tokens (max_position_embeddings)",
    )


def prompt_text(tokenizer, prompt, chat_template_kwargs: dict | None = None) -> str:
    """A conversational prompt goes through the chat template as TRL renders it: after the user's (or a tool's) turn,
    the generation prompt opens the assistant's; a prompt that ends with the assistant's turn has that turn continued
    (`continue_final_message`), not closed. `chat_template_kwargs` (--chat_template_kwargs, e.g. enable_thinking) go
    to the template. A standard (string) prompt is used as it is."""
    if is_conversational(prompt):
        require(
            tokenizer.chat_template is not None,
            "--model_name_or_path: conversational prompts need a tokenizer with a chat template",
        )
        continued = bool(prompt) and prompt[-1]["role"] == "assistant"
        return tokenizer.apply_chat_template(
            prompt,
            tokenize=False,
            add_generation_prompt=not continued,
            continue_final_message=continued,
            **(chat_template_kwargs or {}),
        )
    require(isinstance(prompt, str), f"prompt: expected a string or a list of messages, got {type(prompt).__name__}")
    return prompt


# ----------------------------------------------------------------------------------------------------------------------
# Tokenizer, models
# ----------------------------------------------------------------------------------------------------------------------
def load_tokenizer(path: str, flag: str = "--model_name_or_path", **options):
    """The tokenizer at `path`, padding on the left, with a pad token (its eos token when it has none). It must have an
    eos token: that is where a completion ends, and what sft.py and reward_model.py end a sequence with. `options`:
    `loading_options` (a model's attn_implementation is left out)."""
    from transformers import AutoTokenizer

    problem = model_folder_problem(path)  # a folder holding a tokenizer alone is one
    if problem and not (Path(path).expanduser() / "tokenizer_config.json").is_file():
        raise ConfigError(f"{flag}: cannot load a tokenizer from {path!r}: {problem}")
    options.pop("attn_implementation", None)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left", **options)
    except (OSError, ValueError) as error:
        raise ConfigError(f"{flag}: cannot load a tokenizer from {path!r}: {first_line(error)}") from None
    require(
        tokenizer.eos_token is not None,
        f"{flag}: the tokenizer of {path} has no eos token, so no completion could end (set eos_token in its "
        "tokenizer_config.json)",
    )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def loading_options(args, path: str | None = None) -> dict:
    """from_pretrained's keyword arguments from TRL's loading flags, for the policy, its reference, ppo.py's value model
    and the tokenizer. --model_revision names a commit of --model_name_or_path: a model from another `path` (a value
    model from --value_model_path) loads at its own default branch."""
    options = {"trust_remote_code": args.trust_remote_code}
    if path in (None, args.model_name_or_path):
        options["revision"] = args.model_revision
    if args.attn_implementation is not None:
        options["attn_implementation"] = args.attn_implementation
    return options


def load_causal_lm(path: str, flag: str = "--model_name_or_path", **kwargs):
    """A causal LM with every weight from the checkpoint at `path` (a LoRA adapter folder is merged into its base
    model): a checkpoint of another architecture (a reward model, a base model without its LM head) or one that lacks
    weights, which would start random, is one line naming `flag`."""
    from transformers import AutoModelForCausalLM

    model, missing = load_pretrained(AutoModelForCausalLM, path, flag, **kwargs)
    saved_as = model.config.architectures or [type(model).__name__]
    require(
        type(model).__name__ in saved_as, f"{flag}: {path} is a {saved_as[0]}, not a causal LM ({type(model).__name__})"
    )
    require(
        not missing,
        f"{flag}: {len(missing)} weights of {path} are not in the checkpoint and would start random: "
        + ", ".join(missing[:3])
        + (", ..." if len(missing) > 3 else ""),
    )
    # transformers hands the LM head a strided view of the hidden states (the last `logits_to_keep` positions), and
    # PyTorch's bf16 matmul broadcasts the (V, H) weight over the batch of a strided 3-D input: a (B, H, V) copy, 1.8 GB
    # and ~30x the head's time for 32 sequences and a 49,152-token vocabulary on a CPU. A contiguous input is small.
    head = model.get_output_embeddings()
    if head is not None:
        head.register_forward_pre_hook(lambda module, args: (args[0].contiguous(), *args[1:]))
    # --load_in_4bit on a CPU with AVX512-BF16: bitsandbytes (0.50) repacks a 4-bit layer for its CPU inference kernel
    # at the first forward without gradients, one way, and a training forward after that fails. Sampling and training
    # alternate here, so the layers keep the layout both use.
    for module in model.modules():
        if getattr(module, "support_avx512bf16_for_cpu", False):
            module.support_avx512bf16_for_cpu = False
    return model


def quantization(args) -> dict:
    """The `from_pretrained` keywords of the policy's frozen base: with --load_in_4bit (QLoRA, TRL's
    `get_quantization_config`), bitsandbytes' 4-bit linear layers, which compute in bf16 under --bf16 and in float32
    otherwise; else none. Only the base's linear layers are quantized: the embeddings, the norms and the LoRA adapter
    keep their dtype, and the adapter trains in float32."""
    if not args.load_in_4bit:
        return {}
    from transformers import BitsAndBytesConfig

    config = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=args.bnb_4bit_quant_type,
        bnb_4bit_use_double_quant=args.use_bnb_nested_quant,
        bnb_4bit_compute_dtype=torch.bfloat16 if args.bf16 else torch.float32,
    )
    return {"quantization_config": config}


def warn_missing_weights(missing_keys: list[str], flag: str):
    """One line when weights other than the new score head were missing from the checkpoint (they start random)."""
    missing = [key for key in missing_keys if not key.startswith("score.")]
    if missing:
        listed = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
        print(f"warning: {flag}: {len(missing)} weights were not in the checkpoint and start random: {listed}")


def lora_config(args, model, task_type: str = "CAUSAL_LM"):
    """peft's LoraConfig from the shared --lora_* flags, for `model`. Every module that --lora_target_modules names
    must be in it and be a layer LoRA adapts: peft passes over a name that matches nothing while another name matches,
    and its error for a block (`mlp`) prints the whole block."""
    from peft import LoraConfig
    from transformers.pytorch_utils import Conv1D

    targets = split_list(args.lora_target_modules)
    if targets != ["all-linear"]:
        adaptable = (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv1d, torch.nn.Conv2d, Conv1D)
        modules = dict(model.named_modules())
        layers = sorted({name.split(".")[-1] for name, module in modules.items() if isinstance(module, adaptable)})
        listed = f"(its layers: {', '.join(layers)}; or all-linear)"
        for target in targets:
            found = [module for name, module in modules.items() if name == target or name.endswith(f".{target}")]
            require(found, f"--lora_target_modules: {type(model).__name__} has no module {target!r} {listed}")
            block = next((module for module in found if not isinstance(module, adaptable)), None)
            require(
                block is None,
                f"--lora_target_modules: {target!r} is a {type(block).__name__}, not a layer LoRA adapts {listed}",
            )
    return LoraConfig(
        task_type=task_type,
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=targets[0] if targets == ["all-linear"] else targets,
    )


def sampling_config(model, tokenizer, args, greedy: bool = False) -> GenerationConfig:
    """softmax(logits / temperature), or greedy decoding, and nothing else (but NaN logits read as 0); `generate` keeps
    a checkpoint's own generation_config.json (repetition penalty, min_new_tokens, its top_k, ...) out of it.

    A completion ends at any of the checkpoint's end ids (`eos_token_id`, from its generation_config.json, else its
    config.json: an int or a list, such as Llama-3-Instruct's <|eot_id|> next to <|end_of_text|> or Qwen2.5-Instruct's
    two) and at the tokenizer's EOS, as in TRL. Of that file only this field is read: it says what the model's tokens
    mean, the rest how to sample. The scripts end each completion at this config's `eos_token_id` (a list).

    The log-probs are those of the full softmax(logits / temperature), as in TRL: with --top_k > 0 or --top_p < 1 the
    sampler draws from a truncated distribution that the log-probs do not describe, so training is off-policy.
    """
    shipped = model.generation_config.eos_token_id
    shipped = [shipped] if isinstance(shipped, int) else list(shipped or [])  # an int, a list or None
    end_ids = sorted({tokenizer.eos_token_id, *shipped} - {None})
    # top_k 0 = off (None would let transformers fill in its default of 50); greedy decoding takes no sampling flags
    sampling = {} if greedy else {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k}
    return GenerationConfig(
        do_sample=not greedy,
        max_new_tokens=args.max_completion_length,
        eos_token_id=end_ids,
        pad_token_id=tokenizer.pad_token_id,
        remove_invalid_values=True,  # NaN logits (diverged weights) become 0: sampling goes on, `check_finite` stops
        **sampling,
    )


def checkpoint_activations(model):
    """--gradient_checkpointing: recompute each layer's activations in the backward pass instead of keeping them.
    transformers 5 renamed `gradient_checkpointing_enable` to `activation_checkpointing_enable` (the old name warns);
    the new name where the installed version has it."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()


def disable_dropout(model):
    """Dropout off everywhere (TRL's `disable_dropout`): dropout modules, LoRA's included, and the dropout rates that
    transformers' layers keep as float attributes and pass to `F.dropout` themselves (`attention_dropout` in Llama and
    Qwen2, `dropout` in OPT's attention, `attn_pdrop` / `resid_pdrop` in GPT-2's family). Then a train-mode forward
    equals the eval-mode sampler's, and π_old, the KL and the ratio of one batch are computed on the same function."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for name, value in list(vars(module).items()):
            if isinstance(value, float) and ("dropout" in name or name.endswith("pdrop")):
                setattr(module, name, 0.0)
    return model


@torch.no_grad()
def generate(
    model, tokenizer, texts: list[str], generation_config: GenerationConfig, sampler_logprobs: bool = False
) -> dict:
    """Sample one completion per text with `model.generate`, which stops a completion at any of the config's
    `eos_token_id`s and pads it after. Returns prompt_ids / prompt_mask (B, P), left-padded, and the sampled
    completion_ids (B, T); where each completion ends (its mask) is the training script's to say. With
    `sampler_logprobs`, also the sampler's log softmax(logits / temperature) at each sampled token (B, T), float32: read
    from the very logits each token was drawn from, one (B, V) step at a time (never a (B, T, V) tensor)."""
    device = next(model.parameters()).device
    enc = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False).to(device)
    logprobs, last_step = [], []

    def record(input_ids, scores):  # a logits processor: called before each token is drawn, after the previous one
        if last_step:
            logprobs.append(last_step.pop().gather(-1, input_ids[:, -1:]))
        last_step.append((scores.float() / generation_config.temperature).log_softmax(-1))
        return scores

    # transformers fills every field `generation_config` leaves unset from the model's own generation_config (a hub
    # checkpoint's repetition penalty, min_new_tokens, suppressed tokens, ...): swap it out while sampling
    transformers_model = model.get_base_model() if hasattr(model, "get_base_model") else model  # under peft
    shipped, transformers_model.generation_config = transformers_model.generation_config, generation_config
    try:
        processors = [record] if sampler_logprobs else []  # before the temperature: raw logits
        sequences = model.generate(**enc, generation_config=generation_config, logits_processor=processors)
    finally:
        transformers_model.generation_config = shipped
    out = {
        "prompt_ids": enc.input_ids,
        "prompt_mask": enc.attention_mask,
        "completion_ids": sequences[:, enc.input_ids.shape[1] :],
    }
    if sampler_logprobs:
        logprobs.append(last_step.pop().gather(-1, sequences[:, -1:]))
        out["sampler_logprobs"] = torch.cat(logprobs, 1)
    return out


def sample_completions(
    accelerator: Accelerator,
    model,
    tokenizer,
    texts: list[str],
    generation_config: GenerationConfig,
    vllm=None,
    sampler=None,
) -> dict:
    """One completion per text (the tensors of `generate`): from the colocated vLLM engine when there is one
    (--use_vllm, vllm_colocate.py), else from the bf16 sampler when there is one (`bf16_sampler`), else from the policy
    itself, in eval mode (under --bf16 with autocast). A sampler that is not the policy (vLLM, the bf16 copy) also
    returns `sampler_logprobs` (B, T), its log-probs of the sampled tokens, for the importance-sampling correction."""
    if vllm is not None:
        return vllm.generate(texts, accelerator.device)
    model.eval()
    with generation_model(accelerator, model, sampler) as policy, accelerator.autocast():
        out = generate(policy, tokenizer, texts, generation_config, sampler_logprobs=sampler is not None)
    model.train()
    return out


def release_freed_memory():
    """Hand the memory freed during a training step back to the operating system, once per step, when glibc's heap
    holds more than TRIM_THRESHOLD of it.

    Blocks below glibc's mmap threshold come from its heap (below 4 MB once `map_large_blocks` has fixed it; left to
    itself glibc raises it to 32 MB); a freed block is kept there, and when the next step's tensors do not fit the
    fragments the heap grows. Measured on rloo.py --bf16, 135M parameters, before `map_large_blocks`: 1.4 GB in use at
    the end of each step, 4.5 GB free in the heap, and a resident size that grew step after step with no tensor
    leaking. `malloc_trim` returns every free page. Below the threshold the pages stay for the next step, which would
    otherwise fault every one of them back in (on the embedded model, ~15% of its step time). On CUDA the caching
    allocator keeps its own blocks and this touches only host memory; without glibc it does nothing."""
    libc = _libc()
    trim, heap = getattr(libc, "malloc_trim", None), getattr(libc, "mallinfo2", None)
    if trim is not None and (heap is None or heap().fordblks > TRIM_THRESHOLD):
        trim(0)


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 4 * 2**20  # bytes: a block at least this large gets a mapping of its own, unmapped when freed
TRIM_THRESHOLD = 128 * 2**20  # bytes of free heap kept for the next step


def map_large_blocks():
    """Fix glibc's mmap threshold at MMAP_THRESHOLD (4 MB), so that within a step every large tensor is a mapping of
    its own, returned to the operating system as soon as it is freed; and its trim threshold at TRIM_THRESHOLD, which
    fixing the other one would leave at 128 KB: the top of the heap would go back at nearly every free and fault back
    in at the next allocation.

    Left to itself the mmap threshold rises to 32 MB as large blocks are freed, and from then on activations come from
    the heap, whose free fragments stay resident until `release_freed_memory` at the end of the step. Measured on
    rloo.py --use_peft, fp32, 135M parameters, 32 completions: 4.8 GB in use at the peak of the backward pass but 8.4 GB
    resident (6.4 GB with the fixed threshold). A threshold set in the environment (MALLOC_MMAP_THRESHOLD_) is left
    as it is; without glibc this does nothing."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is not None and "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)


MALLINFO2 = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()  # glibc 2.33+


class MallInfo2(ctypes.Structure):  # what glibc's mallinfo2() returns
    _fields_ = [(name, ctypes.c_size_t) for name in MALLINFO2]


@functools.cache
def _libc():
    try:
        libc = ctypes.CDLL(None)  # the C library this process runs on
    except (OSError, TypeError):
        return None
    if hasattr(libc, "mallinfo2"):
        libc.mallinfo2.restype = MallInfo2
    return libc


NO_SIGNAL_STEPS = 10  # steps in a row without any reward signal before the warning


def warn_no_reward_signal(accelerator: Accelerator, reward_funcs: dict, args):
    """Said when, for NO_SIGNAL_STEPS training steps in a row (logged or not), every group's completions scored the
    same: the advantages are then zero (up to the KL term) and the run cannot learn from the reward. The scripts count
    the steps and call this once per such stretch: a step with signal starts the count again, so it is said again if
    the signal goes away again."""
    if accelerator.is_main_process:
        print(
            f"\nwarning: no reward signal for {NO_SIGNAL_STEPS} steps in a row: the completions of every group got "
            f"equal rewards from {', '.join(reward_funcs)}, so the policy gradient of the reward is zero. Usual "
            "causes: "
            f"a reward too strict for this model (e.g. an answer format it never produces), or --max_completion_length "
            f"{args.max_completion_length} too short to reach the answer.",
            file=sys.stderr,
            flush=True,
        )


def reward_metrics(rewards_per_func: torch.Tensor, reward_funcs: dict) -> dict:
    """TRL's `rewards/<name>/mean|std` over the completions each function applies to (NaN where it returned None)."""
    metrics = {}
    for j, name in enumerate(reward_funcs):
        metrics[f"rewards/{name}/mean"] = rewards_per_func[:, j].nanmean().item()
        metrics[f"rewards/{name}/std"] = nanstd(rewards_per_func[:, j]).item()
    return metrics


def completion_metrics(lengths: torch.Tensor, is_truncated: torch.Tensor) -> dict:
    """TRL's `completions/*` from the lengths (B,) in tokens and whether each completion hit max_completion_length."""
    terminated = lengths[~is_truncated]
    return {
        "completions/mean_length": lengths.mean().item(),
        "completions/min_length": lengths.min().item(),
        "completions/max_length": lengths.max().item(),
        "completions/clipped_ratio": is_truncated.float().mean().item(),
        "completions/mean_terminated_length": terminated.mean().item() if len(terminated) else 0.0,
        "completions/min_terminated_length": terminated.min().item() if len(terminated) else 0.0,
        "completions/max_terminated_length": terminated.max().item() if len(terminated) else 0.0,
    }


def sampling_metrics(accelerator: Accelerator, logprobs, sampler_logprobs, importance_weights, completion_mask) -> dict:
    """TRL's `sampling/*` over the whole batch: the gap |log π_θ_old − log π_sampler| of the completion tokens (mean,
    max) and the importance-sampling weights (min, mean, max; per completion in the sequence modes, else per token)."""
    mask = completion_mask.bool()
    gap = (logprobs - sampler_logprobs).abs()[mask]
    weights = importance_weights.flatten() if importance_weights.shape[1] == 1 else importance_weights[mask]
    mean = lambda x: reduce_over_processes(x.sum(), "sum") / reduce_over_processes(x.new_tensor(x.numel()), "sum")
    gathered = lambda x: accelerator.gather(x[None])  # one value per process
    return {
        "sampling/sampling_logp_difference/mean": mean(gap).item(),
        "sampling/sampling_logp_difference/max": gathered(gap.max()).max().item(),
        "sampling/importance_sampling_ratio/min": gathered(weights.min()).min().item(),
        "sampling/importance_sampling_ratio/mean": mean(weights).item(),
        "sampling/importance_sampling_ratio/max": gathered(weights.max()).max().item(),
    }


def nanstd(values: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sample standard deviation ignoring NaN (unscorable rewards); NaN where fewer than two values count."""
    count = (~values.isnan()).sum(dim)
    centered = values - (values.nanmean() if dim is None else values.nanmean(dim, keepdim=True))
    return (centered.pow(2).nansum(dim) / (count - 1)).sqrt()


# ----------------------------------------------------------------------------------------------------------------------
# Evaluation: the run's rewards on the held-out split, sampled at the training temperature and greedy
# ----------------------------------------------------------------------------------------------------------------------
@torch.no_grad()
def evaluate(
    model, tokenizer, eval_dataset: Dataset, args, reward_funcs: dict, seed: int, weights=None, end_ids=None
) -> dict:
    """The run's reward functions on held-out prompts, each sampled (`num_generations_eval` samples per prompt at the
    training temperature) and `_greedy`: `eval/reward`, their weighted sum (`weights`, default 1.0 each: what training
    maximizes), and `eval/<name>`, each function's mean where it applies (a trailing `_reward` dropped from its name:
    accuracy_reward is eval/accuracy). A test split with a `solution` or `ground_truth` column gets eval/accuracy even
    when the run does not train on it (weight 0: not in eval/reward), so that runs on other rewards compare.

    A completion ends at the training's end tokens (`end_ids`, default the checkpoint's: `sampling_config`). Runs under
    its own RNG, so evaluating never changes what training samples. With several processes, each scores an equal share
    of the prompts (padded by repeating the last one, which is dropped again) and every process returns the same
    means. A reward function that fails is a TrainingError, as in training."""
    processes = PartialState()  # the process layout `accelerate launch` set up (one process without it)
    weights = torch.ones(len(reward_funcs)) if weights is None else weights
    answers = {"solution", "ground_truth"} & set(eval_dataset.column_names)
    extra = {"accuracy_reward": accuracy_reward} if answers and accuracy_reward not in reward_funcs.values() else {}
    names = [name.removesuffix("_reward") for name in [*reward_funcs, *extra]]
    names = [f"rewards/{name}" if name == "reward" else name for name in names]  # not the weighted sum's name
    was_training = model.training
    model.eval()
    columns = [c for c in eval_dataset.column_names if c != "prompt"]
    metrics = {}
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if torch.cuda.is_available() else []):
        torch.manual_seed(seed + 1000 * processes.process_index)
        for suffix, repeats, config in (
            ("", args.num_generations_eval, sampling_config(model, tokenizer, args)),
            ("_greedy", 1, sampling_config(model, tokenizer, args, greedy=True)),
        ):
            config.eos_token_id = end_ids or config.eos_token_id
            rows = [row for row in eval_dataset for _ in range(repeats)]
            scores = {}  # row index -> [reward, each function's]; a padded duplicate overwrites its original
            everyone = list(range(len(rows)))
            everyone += everyone[-1:] * (processes.num_processes - len(everyone))  # fewer rows than processes: repeat
            with processes.split_between_processes(everyone, apply_padding=True) as indices:
                for start in range(0, len(indices), args.per_device_eval_batch_size):
                    batch_indices = indices[start : start + args.per_device_eval_batch_size]
                    batch = [rows[i] for i in batch_indices]
                    prompts = [row["prompt"] for row in batch]
                    out = generate(
                        model,
                        tokenizer,
                        [prompt_text(tokenizer, p, args.chat_template_kwargs) for p in prompts],
                        config,
                    )
                    ids = [until_end(sampled, config.eos_token_id) for sampled in out["completion_ids"].tolist()]
                    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
                    batch_columns = {c: [row[c] for row in batch] for c in columns}
                    try:
                        rewards, per_func = compute_rewards(reward_funcs, weights, prompts, texts, ids, batch_columns)
                        _, per_extra = compute_rewards(
                            extra, torch.ones(len(extra)), prompts, texts, ids, batch_columns
                        )
                    except TrainingError as error:
                        raise TrainingError(f"held-out evaluation: {error}") from None
                    scores.update(zip(batch_indices, torch.cat([rewards[:, None], per_func, per_extra], 1).tolist()))
            merged = {i: v for part in gather_object([scores]) for i, v in part.items()}
            means = torch.tensor(list(merged.values())).nanmean(0)  # NaN (None) where a function does not apply
            for name, mean in zip(["reward", *names], means.tolist()):
                metrics[f"eval/{name}{suffix}"] = mean
    model.train(was_training)
    return metrics


def until_end(ids: list[int], end_ids: list[int]) -> list[int]:
    """A sampled completion's ids up to and including its first end token, as training cuts them."""
    ends = [k for k, token in enumerate(ids) if token in end_ids]
    return ids[: ends[0] + 1] if ends else ids


def eval_summary(first: dict, last: dict, temperature: float) -> str:
    """The final line of a run: held-out accuracy where the evaluation reports one, else the held-out reward."""
    what = "accuracy" if "eval/accuracy" in last else "reward"
    key = f"eval/{what}"
    return (
        f"held-out {what} (sampled, T={temperature}): {first[key]:.3f} → {last[key]:.3f}; "
        f"greedy: {first[key + '_greedy']:.3f} → {last[key + '_greedy']:.3f}"
    )


# ----------------------------------------------------------------------------------------------------------------------
# What every algorithm script sets up the same way: data, policy and reference, rewards, optimizer, and the run
# ----------------------------------------------------------------------------------------------------------------------
def load_data(accelerator: Accelerator, args) -> tuple[Dataset, Dataset | None]:
    """The training split (a 'prompt' column, and every other column for the reward functions) and the held-out
    split, None when the dataset has none."""
    builtin = {"arithmetic": arithmetic_dataset}
    train_dataset = load_split(args.dataset_name, args.dataset_train_split, builtin, config=args.dataset_config)
    require(
        train_dataset is not None,
        f"--dataset_train_split: {args.dataset_name} has no split {args.dataset_train_split!r}",
    )
    check_prompt_column(train_dataset)
    require(
        len(train_dataset) >= args.prompts_per_step,
        f"--prompts_per_step: {args.prompts_per_step} exceeds the {len(train_dataset)} training prompts",
    )
    eval_dataset = load_split(args.dataset_name, args.dataset_test_split, builtin, config=args.dataset_config)
    if eval_dataset is None:
        accelerator.print(f"no held-out split {args.dataset_test_split!r}: evaluation is skipped")
    return train_dataset, eval_dataset


def master_dtype(args) -> torch.dtype:
    """The dtype a trained model loads in: float32 whatever the checkpoint's, except under --use_peft --bf16, whose
    frozen base is bf16 (peft keeps the adapter float32)."""
    return torch.bfloat16 if args.bf16 and args.use_peft else torch.float32


def load_policy_and_reference(accelerator: Accelerator, args, datasets, reference: bool):
    """The tokenizer, the policy to train, the frozen reference (None unless `reference`, and None with --use_peft,
    whose reference is the policy with its adapters disabled).

    The policy's master weights are float32 whatever the checkpoint's dtype (with --use_peft --bf16 its frozen base is
    bf16; with --load_in_4bit 4-bit), in train mode, with --use_peft's LoRA adapter, dropout off (--disable_dropout)
    and --gradient_checkpointing. The reference has nothing to update: bf16 under --bf16, and under DeepSpeed ZeRO-3
    an inference engine (`prepare_frozen`). Every prompt of `datasets` (train, test) must fit the context with
    max_completion_length tokens. A resumed run takes its weights from the checkpoint afterwards (`Run`). Also returns
    the policy's sampling config (`sampling_config`)."""
    tokenizer = load_tokenizer(args.model_name_or_path, **loading_options(args))
    model = load_causal_lm(
        args.model_name_or_path, dtype=master_dtype(args), **loading_options(args), **quantization(args)
    )
    train_dataset, eval_dataset = datasets
    splits = {args.dataset_train_split: train_dataset, args.dataset_test_split: eval_dataset}
    vllm_context = args.vllm_max_model_length if args.use_vllm else None
    check_prompt_lengths(tokenizer, model, args.max_completion_length, splits, vllm_context, args.chat_template_kwargs)
    model = prepare_trainable(model, args)
    ref_model = None
    if reference and not args.use_peft:
        frozen_dtype = torch.bfloat16 if args.bf16 else torch.float32
        ref_model = load_causal_lm(args.model_name_or_path, dtype=frozen_dtype, **loading_options(args))
        ref_model = prepare_frozen(accelerator, ref_model)
    return tokenizer, model, ref_model, sampling_config(model, tokenizer, args)


def load_value_model(args, pad_token_id: int | None = None):
    """ppo.py's value model V_ψ, ready to train (`prepare_trainable`): a sequence-classification model with one label
    from --value_model_path, else --reward_model_path (a LoRA reward model is merged into its base), else the policy's
    checkpoint with a new head, zero-initialized so that V ≡ 0 at the start. Master weights as the policy's."""
    name = next(name for name in ("value_model_path", "reward_model_path", "model_name_or_path") if getattr(args, name))
    path, flag, dtype = getattr(args, name), f"--{name}", master_dtype(args)
    options = loading_options(args, path)
    model, missing = load_sequence_classifier(path, flag, "a value model", new_head=True, dtype=dtype, **options)
    warn_missing_weights(missing, flag)
    require(hasattr(model, "score"), f"{flag}: {type(model).__name__} has no 'score' head to read values from")
    if any(key.startswith("score.") for key in missing):
        torch.nn.init.zeros_(model.score.weight)
    model.config.pad_token_id = pad_token_id  # its forward also reads the head at the last non-pad token
    model = prepare_trainable(model, args, "SEQ_CLS")
    if args.use_peft:
        from peft import cast_mixed_precision_params

        cast_mixed_precision_params(model, dtype)  # trained: peft's copy of the score head too, float32
    return model


def prepare_trainable(model, args, task_type: str = "CAUSAL_LM"):
    """`model` ready to train: --use_peft's LoRA adapter, dropout off (--disable_dropout), --gradient_checkpointing,
    train mode."""
    if args.use_peft:
        from peft import get_peft_model

        model = get_peft_model(model, lora_config(args, model, task_type))
    if args.disable_dropout:
        disable_dropout(model)
    if args.gradient_checkpointing:
        checkpoint_activations(model)
        if args.use_peft:
            model.enable_input_require_grads()
    return model.train()


def load_rewards(accelerator: Accelerator, args, datasets) -> tuple[dict, torch.Tensor]:
    """The reward functions (name -> function or reward model, `rewards.load_reward_funcs`) and their weights, once
    every column they read is known to be in the training split, and in the test split when it is evaluated."""
    frozen = lambda model: prepare_frozen(accelerator, model)
    reward_funcs = load_reward_funcs(
        args.reward_funcs, args.reward_model_path, accelerator.device, frozen, args.max_completion_length
    )
    train_dataset, eval_dataset = datasets
    check_columns(reward_funcs, train_dataset)
    if eval_dataset is not None and args.eval_strategy != "no":
        check_columns(reward_funcs, eval_dataset, "--dataset_test_split")
    return reward_funcs, reward_weights(args.reward_weights, reward_funcs)


def prepare_training(accelerator: Accelerator, args, total_updates: int, *models):
    """`models` ready for `accelerator` (DDP / DeepSpeed / FSDP wrapping, device placement: `prepare`), then one AdamW
    (a parameter group per model, its trainable parameters) and --lr_scheduler_type with --warmup_ratio over
    `total_updates` optimizer steps: (*models, optimizer, scheduler). Two models in one optimizer: DDP only."""
    kind = accelerator.distributed_type
    require(
        len(models) == 1 or kind not in (DistributedType.DEEPSPEED, DistributedType.FSDP),
        f"accelerate launch: {len(models)} models in one optimizer run as one process or under DDP, not {kind.value}",
    )
    groups = [{"params": [p for p in model.parameters() if p.requires_grad]} for model in models]
    optimizer = torch.optim.AdamW(groups, lr=args.learning_rate, weight_decay=args.weight_decay)
    scheduler = transformers.get_scheduler(
        args.lr_scheduler_type,
        optimizer,
        num_warmup_steps=int(args.warmup_ratio * total_updates),
        num_training_steps=total_updates,
    )
    return *prepare(accelerator, *models, optimizer), scheduler


class Run:
    """Everything around an algorithm's loop that is not the algorithm, so that the loop reads as the algorithm:

        with common.Run(accelerator, args, "rloo", model, tokenizer, scheduler, ...) as run:
            for step in run.steps():      # 1, 2, ..., max_steps (from the resumed step)
                ...                       # the algorithm: run.sample(prompts), ..., run.log(step, metrics)
        # here the final model is saved, then evaluated; or, after a stop, a checkpoint is

    - resume (`checkpoint`): the weights, optimizer, registered `scheduler`, RNG, the step, `num_tokens` and `state`
      (the script's own extras, name -> value: a checkpoint saves `run.state` and a resumed run restores it);
    - sampling (`sample`): from vLLM (--use_vllm, sent the weights after every step), the bf16 copy (--bf16) or the
      policy; the held-out evaluation at the start, every eval_steps and at the end;
    - the output folder, claimed once every check has passed (`claim_output_dir`); metrics.jsonl and --report_to
      (`log`), the progress bar;
    - stops: Ctrl-C, SIGTERM or a failing reward function ends the loop after the current step with a checkpoint
      (`graceful_interrupt`); a checkpoint every save_steps, each with the weights once.
    """

    def __init__(
        self, accelerator, args, name, model, tokenizer, scheduler, checkpoint, generation_config, reward_funcs,
        weights, eval_dataset, state=None, others=None, postfix=("reward", "grad_norm"),
    ):  # fmt: skip
        self.accelerator, self.args, self.name, self.model, self.tokenizer = accelerator, args, name, model, tokenizer
        self.scheduler, self.checkpoint, self.generation_config = scheduler, checkpoint, generation_config
        self.reward_funcs, self.weights, self.eval_dataset = reward_funcs, weights, eval_dataset
        self.others, self.postfix = others, postfix
        self.step, self.num_tokens, self.state, self.steps_without_signal = 0, 0, dict(state or {}), 0
        accelerator.register_for_checkpointing(scheduler)  # saved and restored; stepped once per update by the script
        if checkpoint is not None:
            saved = load_training_state(accelerator, checkpoint, model, others)
            self.step, self.num_tokens = saved["step"], saved["num_tokens"]
            self.state = {key: saved[key] for key in self.state}
        self.vllm = None
        if args.use_vllm:  # after resuming, so the engine starts from the resumed weights
            from vllm_colocate import VLLMGenerator

            self.vllm = VLLMGenerator(accelerator, args, tokenizer, model, generation_config.eos_token_id)
        self.sampler = bf16_sampler(accelerator, model, args)  # --bf16: a bf16 copy of the policy samples
        claim_output_dir(accelerator, args)  # every check is done: from here on, this run writes
        self.logger = MetricsLogger(accelerator, args, resume_step=self.step)
        self.first_eval = self.evaluate(0) if self.step == 0 else {}

    def sample(self, prompts: list) -> dict:
        """One completion per prompt (text, or chat messages rendered by `prompt_text`): `sample_completions` from
        vLLM, the bf16 copy or the policy."""
        texts = [prompt_text(self.tokenizer, p, self.args.chat_template_kwargs) for p in prompts]
        return sample_completions(
            self.accelerator, self.model, self.tokenizer, texts, self.generation_config, self.vllm, self.sampler
        )

    def evaluate(self, step: int) -> dict:
        """The held-out metrics (`evaluate`) of the policy now, logged at `step`; {} without a test split."""
        if self.eval_dataset is None or self.args.eval_strategy == "no":
            return {}
        with generation_model(self.accelerator, self.model, self.sampler) as policy:
            metrics = evaluate(
                policy,
                self.tokenizer,
                self.eval_dataset,
                self.args,
                self.reward_funcs,
                seed=self.args.seed + step,
                weights=self.weights,
                end_ids=self.generation_config.eos_token_id,
            )
        self.logger.log(step, metrics)
        return metrics

    def __enter__(self):
        self.stack = contextlib.ExitStack()
        self.interrupted = self.stack.enter_context(graceful_interrupt())
        self.progress = tqdm(
            total=self.args.max_steps, initial=self.step, desc=self.name, disable=not self.accelerator.is_main_process
        )
        return self

    def check_finite(self, **values):
        """`check_finite` at the step being run: every process calls it before each optimizer step."""
        check_finite(self.accelerator, self.step + 1, **values)

    def accumulate(self, micro_batches):
        """Each micro-batch (row indices) of one update; all but the last run forward and backward under DDP's no_sync
        for the policy and `others`, so that their accumulated gradients are all-reduced once, at the last backward."""
        for k, mb in enumerate(micro_batches):
            with contextlib.ExitStack() as stack:
                if k < len(micro_batches) - 1:
                    for model in (self.model, *(self.others or {}).values()):
                        stack.enter_context(self.accelerator.no_sync(model))
                yield mb

    def steps(self):
        """The steps still to run, numbered from 1; after each, vLLM gets the new weights, freed memory goes back to
        the system, and the evaluation and the checkpoint come at their cadence. Stops early after a Ctrl-C or
        SIGTERM seen by any process."""
        args = self.args
        while self.step < args.max_steps and not any_process(self.accelerator, self.interrupted.is_set()):
            self.step_start = time.perf_counter()
            step = self.step + 1
            yield step
            self.step = step
            self.progress.update()
            if self.vllm is not None:
                self.vllm.sync_weights(self.accelerator, self.model)  # the next step samples from the updated policy
            release_freed_memory()  # else glibc's heap keeps it: the resident size would grow
            if args.eval_steps and self.step % args.eval_steps == 0 and self.step != args.max_steps:
                self.evaluate(self.step)
            if args.save_steps and self.step % args.save_steps == 0:
                self.save_checkpoint()

    def save_checkpoint(self) -> Path:
        return save_checkpoint(
            self.accelerator,
            self.args,
            self.step,
            self.model,
            self.tokenizer,
            {"num_tokens": self.num_tokens, **self.state},
            self.others,
            resumed_from=self.checkpoint,
        )

    def count_tokens(self, attention_mask: torch.Tensor):
        """Add the step's tokens (prompts and completions, every process) to `num_tokens`."""
        self.num_tokens += self.accelerator.reduce(attention_mask.sum(), "sum").item()

    def reward_signal(self, has_signal: bool):
        """Count the steps in a row whose rewards carried no signal (`has_signal` False on every process); say so once
        after NO_SIGNAL_STEPS of them (`warn_no_reward_signal`)."""
        self.steps_without_signal = 0 if any_process(self.accelerator, has_signal) else self.steps_without_signal + 1
        if self.steps_without_signal == NO_SIGNAL_STEPS:
            warn_no_reward_signal(self.accelerator, self.reward_funcs, self.args)

    def log(self, step: int, metrics: dict, completions=None):
        """Write `metrics` with the learning rate, `num_tokens` and the step's time; with --log_completions also a
        few of `completions` (prompts, texts, rewards). The step's update is done: a stop from here on keeps it."""
        self.step = step
        metrics = {
            **metrics,
            "learning_rate": self.scheduler.get_last_lr()[0],
            "num_tokens": self.num_tokens,
            "step_time": time.perf_counter() - self.step_start,
        }
        self.logger.log(step, metrics)
        self.progress.set_postfix({key.split("/")[-1]: f"{metrics[key]:.3f}" for key in self.postfix})
        if self.args.log_completions and completions is not None:  # printed, and a table for the trackers
            self.logger.log_completions(step, *completions, self.args.num_completions_to_print)

    def __exit__(self, *error):
        """After the loop: the final model, then the final evaluation and its summary; after a stop (a signal, a
        TrainingError), a checkpoint, and the line that says how to continue (`stop_early`). Any other error passes
        through, with nothing saved."""
        suppressed = self.stack.__exit__(*error)  # a TrainingError is kept as interrupted.error
        self.progress.close()
        if error[0] is not None and not suppressed:
            return False
        args, accelerator = self.args, self.accelerator
        if self.step < args.max_steps or self.interrupted.error:
            path = self.save_checkpoint()
            self.logger.close()
            stop_early(accelerator, self.interrupted, self.step, path)
        # the model first: a stop during the final evaluation then costs only its figures
        save_final_model(accelerator, args.output_dir, self.model, self.tokenizer, args.save_merged_model, self.others)
        last_eval = self.evaluate(self.step)
        self.logger.close()
        if self.first_eval and last_eval:
            accelerator.print(eval_summary(self.first_eval, last_eval, args.temperature))
        accelerator.print(f"saved the model to {args.output_dir}")
        return True


def everywhere(accelerator: Accelerator, *tensors):
    """Each of `tensors` (B_local, ...) gathered from every process: (B, ...), in the order of the one-process batch."""
    gathered = [accelerator.gather(t.to(accelerator.device)) for t in tensors]
    return gathered[0] if len(gathered) == 1 else gathered


def rollout_metrics(accelerator: Accelerator, batch: dict, rewards, reward_funcs: dict, G: int, kl=None, entropy=None):
    """The batch's statistics over every process, under TRL's names: reward, reward_std, frac_reward_zero_std (groups
    of G whose scorable rewards are all equal, or fewer than 2; only when G > 1), each reward function's mean and std,
    the completion lengths, and the means over the completion tokens of `kl` and `entropy` (B, T) when given."""
    mask = batch["completion_mask"]
    rewards, rewards_per_func, lengths, truncated = everywhere(
        accelerator, rewards, batch["rewards_per_func"], mask.sum(1).float(), batch["is_truncated"]
    )
    token_mean = lambda x: (everywhere(accelerator, (x * mask).sum(1)).sum() / lengths.sum().clamp(min=1)).item()
    group_std = nanstd(rewards.view(-1, G), 1)
    return {
        "reward": rewards.nanmean().item(),
        "reward_std": nanstd(rewards).item(),
        **({"frac_reward_zero_std": (~(group_std > 1e-6)).float().mean().item()} if G > 1 else {}),
        **reward_metrics(rewards_per_func, reward_funcs),
        **completion_metrics(lengths, truncated),
        **({"kl": token_mean(kl)} if kl is not None else {}),
        **({"entropy": token_mean(entropy)} if entropy is not None else {}),
    }


def update_metrics(accelerator: Accelerator, losses: list[float], grad_norms, clip_low, clip_high, **other_losses):
    """The updates' statistics, under TRL's names: loss (one per update on each process, averaged over the
    processes), grad_norm, and clip_ratio/*, the fractions of the ratios clipped below (with A < 0) and above (A > 0),
    one per micro-batch; then each of `other_losses` (name -> one per update), averaged as loss."""
    low, high = everywhere(accelerator, torch.tensor(clip_low), torch.tensor(clip_high))
    return {
        "loss": mean_over_processes(accelerator, losses),
        "grad_norm": sum(grad_norms) / len(grad_norms),
        "clip_ratio/low_mean": low.mean().item(),
        "clip_ratio/low_min": low.min().item(),
        "clip_ratio/high_mean": high.mean().item(),
        "clip_ratio/high_max": high.max().item(),
        "clip_ratio/region_mean": (low + high).mean().item(),
        **{name: mean_over_processes(accelerator, values) for name, values in other_losses.items()},
    }


def mean_over_processes(accelerator: Accelerator, values: list[float]) -> float:
    """The mean of `values` (one per update on this process), averaged over the processes."""
    return accelerator.reduce(torch.tensor(sum(values) / len(values), device=accelerator.device), "mean").item()


# ----------------------------------------------------------------------------------------------------------------------
# Checkpoints: HF-format model + tokenizer (or adapter), plus optimizer, scheduler, RNG and step
# ----------------------------------------------------------------------------------------------------------------------
def save_checkpoint(
    accelerator: Accelerator,
    args,
    step: int,
    model,
    tokenizer,
    extra: dict | None = None,
    others: dict | None = None,
    resumed_from: Path | None = None,
) -> Path:
    """Write `checkpoint-{step}` in args.output_dir: the model in HF format (or the LoRA adapter) and the tokenizer,
    which people load and a resumed run takes the weights from, and each of `others` (folder name -> model: ppo's
    value_model) in a folder of its own; `accelerator_state/` (accelerate's: optimizer, registered scheduler, every
    process's RNG; under DeepSpeed / FSDP the sharded weights with the optimizer), for resuming; `args.json`, the run's
    flags (`write_args`), which a resumed run is checked against (`check_resumed_args`); `training_state.pt` with the
    step, the script's extras and the size of every other file (what `checkpoint_problem` checks). The weights are
    written once: accelerate writes its own copy only where the HF files hold them under other names
    (`hf_files_hold_weights`). Written whole (`write_whole`), and no earlier checkpoint is touched, until
    --save_total_limit deletes the oldest beyond the newest N, never `resumed_from` (`delete_old_checkpoints`). Every
    process must call it."""
    output_dir = args.output_dir
    final = Path(output_dir) / f"checkpoint-{step}"
    tmp = Path(output_dir) / f".checkpoint-{step}.tmp"
    models = model_folders(tmp, model, others)

    def write():
        for folder, each in models.items():
            save_model(accelerator, folder, each, tokenizer)
        # accelerate writes weights from the main process only, the one that wrote (and can read) the HF files
        once = accelerator.is_main_process and hf_files_hold_weights(accelerator, models)
        hook = accelerator.register_save_state_pre_hook(
            lambda models, weights, folder: weights.clear() if once else None
        )
        try:
            accelerator.save_state(str(tmp / "accelerator_state"))
        finally:
            hook.remove()

    def publish():
        write_args(args, tmp)
        files = {str(f.relative_to(tmp)): f.stat().st_size for f in tmp.rglob("*") if f.is_file()}
        torch.save({"step": step, **(extra or {}), "files": files}, tmp / "training_state.pt")
        if final.exists():  # the same step saved again: the old copy goes only once the new one is complete
            os.replace(final, tmp.with_suffix(".old"))
        os.replace(tmp, final)
        shutil.rmtree(tmp.with_suffix(".old"), ignore_errors=True)
        if args.save_total_limit:
            delete_old_checkpoints(output_dir, args.save_total_limit, keep=[final, resumed_from])

    write_whole(
        accelerator,
        tmp,
        write,
        publish,
        lambda reason: f"cannot write {final} ({reason}); the earlier checkpoints are kept",
    )
    return final


def model_folders(folder: Path, model, others: dict | None) -> dict:
    """Where a checkpoint holds each model: `model` in `folder`, each of `others` (name -> model) in folder/name."""
    return {folder: model, **{folder / name: other for name, other in (others or {}).items()}}


def write_args(args, folder: Path):
    """`folder`/args.json: every field of `args` (`asdict`), which `--config` reads back; written whole (a temporary
    file, then a rename). The run's record in --output_dir (`claim_output_dir`) and each checkpoint's."""
    tmp = Path(folder) / ".args.json.tmp"
    tmp.write_text(json.dumps(dataclasses.asdict(args), indent=2) + "\n")
    os.replace(tmp, Path(folder) / "args.json")


def weight_files(folder: Path, model) -> list[Path]:
    """The safetensors files `save_pretrained` wrote `model` (unwrapped) into: the adapter of a peft model, else the
    weights, one file or its shards."""
    pattern = "adapter_model.safetensors" if hasattr(model, "peft_config") else "model*.safetensors"
    return sorted(Path(folder).glob(pattern))


def trainable_names(model) -> set[str]:
    """The names `load_weights` must find: every trainable parameter's (a tied one once, under its first name)."""
    return {name for name, parameter in model.named_parameters() if parameter.requires_grad}


def hf_files_hold_weights(accelerator: Accelerator, models: dict) -> bool:
    """Whether the HF-format files `save_model` wrote (folder -> prepared model) restore every model exactly
    (`load_weights`), so that accelerate need not write the weights again: not under DeepSpeed or FSDP, whose own
    files hold the sharded weights, nor for a model that transformers saves under other names than it trains them
    (the fused experts of some mixture-of-experts models are saved one by one); a LoRA adapter always does."""
    if accelerator.distributed_type in (DistributedType.DEEPSPEED, DistributedType.FSDP):
        return False
    for folder, model in models.items():
        unwrapped = accelerator.unwrap_model(model)
        if not hasattr(unwrapped, "peft_config"):
            saved = set()
            for file in weight_files(folder, unwrapped):
                with safe_open(file, "pt") as f:
                    saved.update(f.keys())
            if not trainable_names(unwrapped) <= saved:
                return False
    return True


def load_weights(accelerator: Accelerator, folder: Path, model):
    """Restore `model`'s weights (with LoRA: its adapter) in place from the HF-format files `save_model` wrote into
    `folder`, exactly as saved. A full model is read one tensor at a time (a 7B float32 policy is 28 GB, on every
    process). A trainable weight the files lack, a weight the model lacks or one of another shape is a ValueError."""
    from peft import set_peft_model_state_dict

    unwrapped = accelerator.unwrap_model(model)
    files = weight_files(folder, unwrapped)
    if not files:
        raise ValueError(f"{folder} holds no {'LoRA adapter' if hasattr(unwrapped, 'peft_config') else 'full model'}")
    if hasattr(unwrapped, "peft_config"):
        loaded = set_peft_model_state_dict(unwrapped, {k: v for file in files for k, v in load_file(file).items()})
        missing, unexpected = set(loaded.missing_keys), loaded.unexpected_keys
    else:
        own, unexpected = unwrapped.state_dict(keep_vars=True), []
        missing = set(own)
        for file in files:
            with safe_open(file, "pt") as f, torch.no_grad():
                for key in f.keys():
                    if key not in own:
                        unexpected.append(key)
                        continue
                    saved = f.get_tensor(key)
                    if saved.shape != own[key].shape:
                        raise ValueError(f"{key} is {tuple(saved.shape)} in {folder}, not {tuple(own[key].shape)}")
                    own[key].copy_(saved)
                    missing.discard(key)
    missing = sorted(trainable_names(unwrapped) & missing)
    if missing or unexpected:
        raise ValueError(f"{folder}: missing {missing[:3]}, unexpected {unexpected[:3]}")


def delete_old_checkpoints(output_dir: str, limit: int, keep: list[Path | None]):
    """--save_total_limit: delete the oldest complete checkpoint-N folders beyond the newest `limit`, except those in
    `keep` (the one just saved, the one this run resumed from), so that a resumed run keeps its starting point. A
    folder is renamed before it is deleted: a kill meanwhile leaves no half checkpoint-N."""
    found = [p for p in Path(output_dir).glob("checkpoint-*") if CHECKPOINT_NAME.fullmatch(p.name)]
    complete = sorted((p for p in found if checkpoint_problem(p) is None), key=lambda p: int(p.name.split("-")[1]))
    kept = {Path(path).resolve() for path in keep if path is not None}
    for path in complete[: max(len(complete) - limit, 0)]:
        if path.resolve() not in kept:
            doomed = path.with_name(f".{path.name}.deleted")
            with contextlib.suppress(OSError):  # one that cannot be deleted is kept
                os.replace(path, doomed)
                shutil.rmtree(doomed)


def write_whole(accelerator: Accelerator, tmp: Path, write, publish, failed):
    """Every process runs `write()` into the temporary folder `tmp`; once all succeeded, the main process runs
    `publish()`, which moves it into place with renames. Signals are held meanwhile (`signals_deferred`), so nothing is
    half-written. A write that fails (a full disk; whatever the error: torch raises RuntimeError, safetensors its own)
    removes `tmp` and stops every process with one line, `--output_dir: ` + `failed(reason)`."""
    failure = None
    with signals_deferred(), quiet_saves():
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        accelerator.wait_for_everyone()
        try:
            write()
        except Exception as error:
            failure = error
        if not any_process(accelerator, failure is not None) and accelerator.is_main_process:  # every file is written
            try:
                publish()
            except Exception as error:
                failure = error
        if any_process(accelerator, failure is not None):
            reason = write_failure(failure, tmp.parent)  # before the removal frees the space
            if accelerator.is_main_process:
                shutil.rmtree(tmp, ignore_errors=True)
            raise ConfigError(f"--output_dir: {failed(reason)}")


LOW_DISK_SPACE = 64 * 2**20  # bytes: a failed write with less free than this was most likely the disk filling up


def write_failure(error: Exception | None, folder: Path) -> str:
    """Why a write into `folder` failed, in a few words: the error's first line, and that the disk may be full when
    little space is left."""
    if error is None:
        return "failed on another process"
    if isinstance(error, OSError) and error.strerror:
        reason = error.strerror
    else:
        reason = f"{type(error).__name__}: {first_line(error)}"
    free = shutil.disk_usage(folder).free
    if free < LOW_DISK_SPACE and getattr(error, "errno", None) != errno.ENOSPC:
        reason += f"; the disk may be full: {free / 2**20:.1f} MB free"
    return reason


CHECKPOINT_NAME = re.compile(r"checkpoint-(\d+)")


def checkpoint_problem(path: Path) -> str | None:
    """Why `path` is not a complete checkpoint (None when it is): no training_state.pt, one that does not load (a
    truncated copy), or a file that is missing or of another size than when it was saved (a half-copied folder)."""
    if not (path / "training_state.pt").is_file():
        return "no training_state.pt"
    try:
        state = torch.load(path / "training_state.pt", weights_only=False, map_location="cpu")
    except Exception as error:
        return f"training_state.pt does not load ({first_line(error)}): truncated?"
    if not isinstance(state, dict) or "step" not in state:
        return "training_state.pt holds no step"
    if "files" not in state:  # saved before sizes were recorded: at least the resume state must be there
        return None if list(path.glob("accelerator_state/random_states_*.pkl")) else "no accelerator_state/"
    for name, size in state["files"].items():
        if not (path / name).is_file():
            return f"{name} is missing"
        if (path / name).stat().st_size != size:
            return f"{name} has {(path / name).stat().st_size} of its {size} bytes"
    return None


def resolve_checkpoint(resume_from_checkpoint: str | None, output_dir: str, args=None) -> Path | None:
    """None, a checkpoint folder, or 'latest': the highest-step complete checkpoint-N in output_dir. Each folder
    skipped is said in one line with the reason: one that is not a complete checkpoint (`checkpoint_problem`), another
    name (checkpoint-best), a temporary folder whose write did not finish (.checkpoint-N.tmp). So are the lines of
    output_dir/metrics.jsonl torn by a kill, which the resumed run drops. With the run's `args`, the checkpoint's flags
    are checked against them (`check_resumed_args`)."""
    checkpoint = find_checkpoint(resume_from_checkpoint, output_dir)
    if checkpoint is not None and args is not None:
        check_resumed_args(checkpoint, args)
    return checkpoint


# What a resumed run may change: how long it goes on, what it logs, evaluates and saves, and how the same computation
# runs. It carries on and says what changed. Any other flag that differs from the checkpoint's args.json stops the
# resume with one line: the model and its LoRA (the checkpoint's weights would not fit, or mean another model), the
# data, the rewards and the algorithm's settings (another objective), and --learning_rate and --weight_decay, which the
# checkpoint's optimizer state keeps (a new value would be ignored). Flags a checkpoint does not record (it was saved
# before they existed, or before args.json was) are not compared.
RESUME_MAY_CHANGE = {
    # how long, and what is logged, evaluated and saved
    "max_steps",  # the learning-rate schedule is that of the new length from here on
    "logging_steps",
    "log_completions",
    "num_completions_to_print",
    "report_to",
    "eval_strategy",
    "eval_steps",
    "num_generations_eval",
    "per_device_eval_batch_size",
    "dataset_test_split",
    "save_steps",
    "save_total_limit",
    "save_merged_model",
    "output_dir",
    # the rest of the schedule, which the checkpoint does not hold
    "lr_scheduler_type",
    "warmup_ratio",
    "max_grad_norm",
    # the same computation, run otherwise: memory, speed, precision, the sampling engine, the seed of what comes next
    "micro_batch_size",
    "gradient_checkpointing",
    "bf16",
    "use_vllm",
    "vllm_gpu_memory_utilization",
    "vllm_max_model_length",
    "attn_implementation",
    "trust_remote_code",
    "seed",
}


def check_resumed_args(checkpoint: Path, args):
    """Compare this run's flags with those the checkpoint was saved with (its args.json; a checkpoint without one
    resumes unchecked): a change that RESUME_MAY_CHANGE lists is said in one line, any other is a ConfigError naming
    every such flag with both values."""
    record = checkpoint / "args.json"
    if not record.is_file():
        return
    saved, now = json.loads(record.read_text()), json.loads(json.dumps(dataclasses.asdict(args)))
    changed = [
        name
        for name in saved.keys() & now.keys() - {"resume_from_checkpoint", "overwrite_output_dir"}
        if not same_setting(saved[name], now[name])
    ]
    changed.sort(key=list(now).index)
    typed = lambda value: " ".join(map(str, value)) if isinstance(value, list) else value  # as on the command line
    said = lambda names: "; ".join(
        f"--{name} {typed(now[name])} (the checkpoint's: {typed(saved[name])})" for name in names
    )
    refused = [name for name in changed if name not in RESUME_MAY_CHANGE]
    require(
        not refused,
        f"--resume_from_checkpoint: {checkpoint.name} was saved with other flags, which a resumed run cannot change: "
        f"{said(refused)}. Resume with its flags ({record}), or start a new run from its model (--model_name_or_path "
        f"{checkpoint})",
    )
    if changed and PartialState().is_main_process:
        print(f"--resume_from_checkpoint: carrying on from {checkpoint.name} with {said(changed)}")


def same_setting(saved, now) -> bool:
    """Equal values, two paths to the same existing file or folder (a relative and an absolute one), or a list flag
    given in either form (`--reward_funcs accuracy format` is `--reward_funcs accuracy,format`)."""
    if saved == now:
        return True
    if isinstance(saved, list) or isinstance(now, list):
        return split_list(saved) == split_list(now)
    if isinstance(saved, str) and isinstance(now, str) and Path(saved).exists() and Path(now).exists():
        return Path(saved).resolve() == Path(now).resolve()
    return False


def find_checkpoint(resume_from_checkpoint: str | None, output_dir: str) -> Path | None:
    if not resume_from_checkpoint:
        return None
    say = print if PartialState().is_main_process else lambda line: None
    torn = torn_metrics_lines(output_dir)
    if torn:
        say(f"--resume_from_checkpoint: dropping {torn} line(s) of metrics.jsonl that do not parse (torn by a kill)")
    if resume_from_checkpoint != "latest":
        path = Path(resume_from_checkpoint)
        require(path.is_dir(), f"--resume_from_checkpoint: {path} is not a checkpoint (no such folder)")
        problem = checkpoint_problem(path)
        require(problem is None, f"--resume_from_checkpoint: {path} is not a checkpoint ({problem})")
        return path
    folders = sorted(p for p in Path(output_dir).glob("*checkpoint-*") if p.is_dir())
    found = [p for p in folders if CHECKPOINT_NAME.fullmatch(p.name)]
    skipped = [f"{p.name} ({not_numbered(p.name)})" for p in folders if p not in found and not_numbered(p.name)]
    for path in sorted(found, key=lambda p: int(p.name.split("-")[1]), reverse=True):
        problem = checkpoint_problem(path)
        if problem is None:
            for folder in skipped:
                say(f"--resume_from_checkpoint latest: {path.name}, skipping {folder}")
            return path
        skipped.append(f"{path.name} ({problem})")
    detail = f" is complete (skipped {'; '.join(skipped)})" if skipped else ""
    raise ConfigError(f"--resume_from_checkpoint latest: no checkpoint-N folder in {output_dir}{detail}")


def not_numbered(name: str) -> str | None:
    """Why `latest` passes over a folder whose name looks like a checkpoint's but is not checkpoint-N."""
    if name.startswith(".checkpoint-"):
        return "a write that did not finish" if name.endswith(".tmp") else "a temporary folder"
    if name.startswith("checkpoint-"):
        return "not named checkpoint-N: pass it to --resume_from_checkpoint by its path"
    return None


def torn_metrics_lines(output_dir: str) -> int:
    """How many lines of output_dir/metrics.jsonl do not parse (`read_metrics` skips them)."""
    path = Path(output_dir) / "metrics.jsonl"
    if not path.is_file():
        return 0
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return len(lines) - len(read_metrics(output_dir))


def load_training_state(accelerator: Accelerator, checkpoint: Path, model, others: dict | None = None) -> dict:
    """Restore what `save_checkpoint` saved: the weights of the prepared `model` and of each of `others` (folder name
    -> model) from their HF-format files (`load_weights`; under DeepSpeed / FSDP, or where accelerate kept its own copy,
    from accelerator_state/), the optimizer(s), the registered scheduler and this process's RNG; returns the step and
    the script's extras. Resume with the same number of processes."""
    saved = len(list((checkpoint / "accelerator_state").glob("random_states_*.pkl")))
    require(
        saved == accelerator.num_processes,
        f"--resume_from_checkpoint: {checkpoint} was saved by {saved} processes; resume it with as many (got "
        f"{accelerator.num_processes})",
    )
    sharded = accelerator.distributed_type in (DistributedType.DEEPSPEED, DistributedType.FSDP)
    from_hf_files = not sharded and not list((checkpoint / "accelerator_state").glob("model*.safetensors"))
    # accelerate's own copy of a 4-bit base holds its quantization constants, which load_state_dict takes back as
    # unexpected keys: the frozen base is as loaded, and the flags that shape the adapter match args.json
    saved_args = checkpoint / "args.json"
    quantized = saved_args.is_file() and json.loads(saved_args.read_text()).get("load_in_4bit", False)
    try:
        for folder, each in model_folders(checkpoint, model, others).items() if from_hf_files else ():
            load_weights(accelerator, folder, each)
        hook = accelerator.register_load_state_pre_hook(
            lambda models, folder: models.clear() if from_hf_files else None
        )
        try:
            accelerator.load_state(str(checkpoint / "accelerator_state"), strict=not quantized)
        finally:
            hook.remove()
    except (RuntimeError, ValueError, KeyError) as error:  # saved before args.json, or the model changed on disk
        raise ConfigError(
            f"--resume_from_checkpoint: {checkpoint} does not fit this run's model and optimizer (was it saved with "
            f"another --model_name_or_path, --use_peft or --lora_* flags?): {first_line(error)}"
        ) from None
    return torch.load(checkpoint / "training_state.pt", weights_only=False, map_location="cpu")


@contextlib.contextmanager
def quiet_saves():
    """Saving without noise a user cannot act on: accelerate's "Removed shared tensor" warning (tied embeddings are
    saved once, as they should be) and transformers' "Writing model shards" progress bar."""
    accelerate_logger = logging.getLogger("accelerate.utils.other")
    tied = lambda record: "Removed shared tensor" not in record.getMessage()
    bars = transformers_logging.is_progress_bar_enabled()
    accelerate_logger.addFilter(tied)
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        accelerate_logger.removeFilter(tied)
        if bars:
            transformers_logging.enable_progress_bar()


def save_model(accelerator: Accelerator, output_dir, model, tokenizer):
    """The model in HF format (with LoRA: the adapter) and the tokenizer, written by the main process; the weights
    come from `accelerator.get_state_dict`, which gathers DeepSpeed ZeRO-3 / FSDP shards. Every process must call it."""
    state_dict = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        with quiet_saves():
            accelerator.unwrap_model(model).save_pretrained(output_dir, state_dict=state_dict)
        tokenizer.save_pretrained(output_dir)


def save_final_model(
    accelerator: Accelerator, output_dir: str, model, tokenizer, save_merged: bool = False, others: dict | None = None
):
    """The trained model in HF format at output_dir (with LoRA the adapter), and each of `others` (folder name ->
    model, e.g. ppo's value_model) in a folder of its own; with `save_merged` also the merged full model in
    output_dir/merged, loadable with AutoModelForCausalLM. Written whole (`write_whole`) into output_dir/.final.tmp and
    moved into output_dir once complete, its config last: a full disk leaves no half-written model, and the line names
    the newest checkpoint kept. Every process must call it."""
    out = Path(output_dir)
    tmp = out / ".final.tmp"

    def write():
        save_model(accelerator, tmp, model, tokenizer)
        for name, other in (others or {}).items():
            save_model(accelerator, tmp / name, other, tokenizer)
        unwrapped = accelerator.unwrap_model(model)
        if save_merged and hasattr(unwrapped, "merge_and_unload") and accelerator.is_main_process:
            # merged into a 4-bit base the weights would be rounded to 4 bits again: QLoRA's adapter goes into the
            # full-precision base (the adapter folder just written names it)
            quantized = getattr(unwrapped, "is_loaded_in_4bit", False)
            merged = load_causal_lm(str(tmp), dtype=torch.float32) if quantized else unwrapped.merge_and_unload()
            merged.save_pretrained(tmp / "merged")
            tokenizer.save_pretrained(tmp / "merged")

    def publish():
        # the configs last: a folder with a config has its weights (a kill between two renames leaves none)
        for path in sorted(tmp.iterdir(), key=lambda path: path.name in ("config.json", "adapter_config.json")):
            target = out / path.name
            if path.is_dir() and target.exists():  # an earlier final save's folder (a resumed run): replaced whole
                os.replace(target, tmp / f"{path.name}.old")
                shutil.rmtree(tmp / f"{path.name}.old")
            os.replace(path, target)
        tmp.rmdir()

    write_whole(
        accelerator,
        tmp,
        write,
        publish,
        lambda reason: f"cannot write the final model to {out} ({reason}); {newest_checkpoint_kept(output_dir)}",
    )


# ----------------------------------------------------------------------------------------------------------------------
# The output folder: one run at a time, and a fresh run never mixes with another run's files
# ----------------------------------------------------------------------------------------------------------------------
LOCK_FILE = ".run.lock"
LOCK_STALE_S = 300.0  # a lock its run has not refreshed for this long is taken over (the run refreshes it every 100 s)
LEASES: dict[str, filelock.SoftFileLease] = {}  # output_dir -> this process's lock on it


def claim_output_dir(accelerator: Accelerator, args):
    """Make --output_dir this run's, just before its first file is written (main process; every process stops alike):
    take its lock (`take_lock`), refuse or delete another run's files (`claim_contents`), write `args.json`."""
    message = None
    if accelerator.is_main_process:
        try:
            message = take_lock(Path(args.output_dir)) or claim_contents(args)
            if message is None:
                write_args(args, Path(args.output_dir))
        except OSError as error:
            message = f"--output_dir: cannot write to {args.output_dir}: {error.strerror or error}"
    if accelerator.num_processes > 1:
        message = broadcast_object_list([message])[0]
    require(message is None, message)


def take_lock(out: Path) -> str | None:
    """Hold out/.run.lock until the run ends (`cli` releases it); the reason it cannot, or None.

    The lock is filelock's SoftFileLease: created exclusively (of runs starting together, one gets it), with this
    process's pid and host, refreshed by a heartbeat thread. It is taken over at once when its process is gone from
    this host (a crash, a kill). A lock from another host (a job requeued on another node, a preempted pod) cannot be
    asked: this run waits until it has gone LOCK_STALE_S unrefreshed, and then takes it over."""
    out.mkdir(parents=True, exist_ok=True)
    release_output_dir(out)  # an earlier run in this same process (main called twice, as tests do)
    lease = filelock.SoftFileLease(out / LOCK_FILE, lease_duration=LOCK_STALE_S)
    holder = lease.owner  # None: no lock, or one being written (or torn by a crash)
    who = lambda holder: f"pid {holder.pid} on {host_of(holder)}" if holder else "a run its lock does not name"
    with contextlib.suppress(filelock.Timeout):
        lease.acquire(timeout=0)
    if not lease.is_locked and not this_host(holder := lease.owner):
        print(f"--output_dir: {out} is locked by {who(holder)}: waiting {LOCK_STALE_S:.0f} s for its heartbeat to stop")
        with contextlib.suppress(filelock.Timeout):
            lease.acquire(timeout=LOCK_STALE_S * 1.5)  # a live run refreshes its lock every LOCK_STALE_S / 3
    if not lease.is_locked:
        return (
            f"--output_dir: {out} is in use by another run ({who(lease.owner)}): wait for it or choose another folder"
        )
    if holder is not None:
        print(f"--output_dir: took over the lock of {who(holder)}, whose run is gone")
    LEASES[str(out)] = lease
    return None


def host_of(holder: filelock.OwnerRecord) -> str:
    return holder.hostname.partition("?")[0]  # filelock adds "?pidns-..." in a container's own pid namespace


def this_host(holder: filelock.OwnerRecord | None) -> bool:
    """Whether a lock's holder runs on this host, where filelock tells a live holder from a dead one."""
    return holder is not None and host_of(holder) == socket.gethostname()


def another_runs_files(args) -> list[Path]:
    """What a fresh run (no --resume_from_checkpoint) would mix with: another run's checkpoints and metrics."""
    out = Path(args.output_dir)
    if args.resume_from_checkpoint or not out.is_dir():
        return []
    metrics = out / "metrics.jsonl"
    checkpoints = sorted(p for p in out.glob("*checkpoint-*") if p.is_dir())  # .checkpoint-N.tmp too
    return checkpoints + ([metrics] if metrics.is_file() and metrics.stat().st_size else [])


def used_folder_message(args, used: list[Path]) -> str:
    listed = ", ".join(p.name for p in used[:3]) + (", ..." if len(used) > 3 else "")
    return (
        f"--output_dir: {args.output_dir} holds another run ({listed}): continue it with --resume_from_checkpoint "
        "latest, start over with --overwrite_output_dir, or choose another folder"
    )


def claim_contents(args) -> str | None:
    """Refuse (or, with --overwrite_output_dir, delete) another run's metrics and checkpoints; the reason, or None."""
    used = another_runs_files(args)
    if not used:
        return None
    if not args.overwrite_output_dir:
        release_output_dir(args.output_dir)
        return used_folder_message(args, used)
    for path in used:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    print(f"--overwrite_output_dir: deleted {', '.join(p.name for p in used)} from {args.output_dir}")
    return None


def release_output_dir(output_dir: str | Path):
    """Release this process's lock on output_dir, if it holds one."""
    if (lease := LEASES.pop(str(Path(output_dir)), None)) is not None:
        lease.release()


# ----------------------------------------------------------------------------------------------------------------------
# Logging: {output_dir}/metrics.jsonl (one object per logged step) and the --report_to trackers, all through accelerate
# ----------------------------------------------------------------------------------------------------------------------
PROJECT = "huggingface"  # the trackers' project: transformers' and TRL's default for W&B and trackio
COMPLETION_COLUMNS = ["step", "prompt", "completion", "reward"]


def tracker_names(report_to: str | list[str]) -> list[str]:
    """The accelerate trackers --report_to names (a list, or names separated by commas): any of accelerate's
    (`LoggerType`: tensorboard, wandb, trackio, comet_ml, mlflow, aim, clearml, dvclive, swanlab), `all` for every
    one whose package is installed, or `none`. An unknown name, or one whose package is missing, is a ConfigError."""
    names = split_list(report_to)
    for alone in {"all", "none"} & set(names):
        require(len(names) == 1, f"--report_to: {alone} stands alone, got {' '.join(names)}")
    if names in ([], ["none"]):
        return []
    installed = [str(tracker) for tracker in get_available_trackers()]
    if names == ["all"]:
        return installed
    for name in names:
        require(
            name in LOGGER_TYPE_TO_CLASS,
            f"--report_to: unknown tracker {name!r} (accelerate's: {', '.join(sorted(LOGGER_TYPE_TO_CLASS))}; or all, "
            "none)",
        )
    for name in names:  # a tracker registered with accelerate (not one of its own) brings its package with it
        require(
            name in installed or name not in {str(t) for t in LoggerType},
            f"--report_to {name}: the {name} package is not installed (pip install {name})",
        )
    return list(dict.fromkeys(names))


class MetricsFile(GeneralTracker):
    """{output_dir}/metrics.jsonl as one of accelerate's trackers: each record is one line `{"step": N, ...}`, appended
    in one write, whole or not at all; a value that is not finite is written as null. A write that fails (a full disk)
    is cut back off and raises a TrainingError."""

    name = "metrics.jsonl"
    requires_logging_directory = False

    def __init__(self, output_dir: str):
        super().__init__()
        self.path = Path(output_dir) / "metrics.jsonl"

    @property
    def tracker(self):
        return self.path

    def log(self, values: dict, step: int | None = None, **kwargs):
        record = {"step": step, **{k: (float(v) if isinstance(v, (int, float)) else v) for k, v in values.items()}}
        record = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        line = (json.dumps(record) + "\n").encode()
        try:
            with open(self.path, "ab", buffering=0) as f:  # unbuffered: one write
                size = f.tell()
                if f.write(line) < len(line):  # the disk filled during the write
                    f.truncate(size)  # no torn line for the next record to be glued to
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as error:
            raise TrainingError(
                f"--output_dir: cannot append to {self.path} ({write_failure(error, self.path.parent)})"
            ) from None


class MetricsLogger:
    """The run's logging: metrics.jsonl and the --report_to trackers, which `make_accelerator` handed to accelerate.
    `log` goes to all of them (`accelerator.log`). Only the main process writes, but every process calls `log`, so
    that a write or a tracker that fails stops them all with one line (in the loop, after a checkpoint)."""

    def __init__(self, accelerator: Accelerator, args, resume_step: int = 0):
        self.accelerator = accelerator
        path = Path(args.output_dir) / "metrics.jsonl"
        reason = restart_metrics(path, resume_step) if accelerator.is_main_process else None
        failure = f"--output_dir: cannot write {path} ({reason})" if reason else None
        if failure is None and accelerator.is_main_process:
            # tensorboard's hyperparameters take numbers, strings and booleans only
            config = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in vars(args).items()}
            try:
                accelerator.init_trackers(PROJECT, config, init_kwargs={"wandb": {"dir": args.output_dir}})
            except Exception as error:  # a tracker that cannot start: not logged in, no server, ...
                failure = f"--report_to: cannot start the trackers: {type(error).__name__}: {first_line(error)}"
        if any_process(accelerator, failure is not None):
            raise ConfigError(failure or f"--output_dir: cannot write {path} (failed on the main process)")

    def log(self, step: int, metrics: dict):
        """Send the record of `step` to every tracker. Every process must call it."""
        self.send_from_main(lambda: self.accelerator.log(metrics, step=step), step)

    def log_completions(self, step: int, prompts: list, completions: list[str], rewards, num_to_print: int):
        """--log_completions: the step's completions from every process, the first `num_to_print` printed, and all
        of them as a table (step, prompt, completion, reward) to each tracker that takes one (accelerate's
        `log_table`: wandb, clearml). Every process must call it."""
        text = lambda prompt: prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)
        rows = gather_object([[step, text(p), c, r] for p, c, r in zip(prompts, completions, rewards.tolist())])

        def send():
            for _, prompt, completion, reward in rows[:num_to_print]:
                tqdm.write(f"[step {step}] {prompt!r} → {completion!r}  reward {reward:.3f}")
            for tracker in self.accelerator.trackers:
                if hasattr(tracker, "log_table"):
                    tracker.log_table("completions", columns=COMPLETION_COLUMNS, data=rows, step=step)

        self.send_from_main(send, step)

    def send_from_main(self, send, step: int):
        """Run `send` (which logs) on the main process; a failure stops every process with one line."""
        failure = None
        if self.accelerator.is_main_process:
            try:
                send()
            except TrainingError as error:  # metrics.jsonl's
                failure = str(error)
            except Exception as error:
                failure = f"--report_to: a tracker failed: {type(error).__name__}: {first_line(error)}"
        if any_process(self.accelerator, failure is not None):
            error = TrainingError(failure or "logging failed on the main process")
            error.step = step
            raise error

    def close(self):
        """End the trackers' runs (accelerate's `end_training` without the process group, which `cli` ends)."""
        for tracker in self.accelerator.trackers:
            tracker.finish()


def restart_metrics(path: Path, resume_step: int) -> str | None:
    """A fresh metrics.jsonl, or a resumed run's without the records past its checkpoint, replacing the old file only
    once written (a full disk keeps it whole); why it failed, or None."""
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = []
    if resume_step and path.exists():  # a resumed run continues the file: drop records past the checkpoint
        kept = [json.dumps(r) for r in read_metrics(path.parent) if r.get("step", 0) <= resume_step]
    tmp = path.with_name(".metrics.jsonl.tmp")
    try:
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, path)
    except OSError as error:
        tmp.unlink(missing_ok=True)
        return write_failure(error, path.parent)
    return None


def read_metrics(output_dir: str) -> list[dict]:
    """The records of {output_dir}/metrics.jsonl; a line that does not parse (torn by a kill mid-write) is skipped."""
    records = []
    for line in (Path(output_dir) / "metrics.jsonl").read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records
