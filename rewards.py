"""Reward functions, reward-model scoring, and how several rewards combine into one scalar per completion.

A reward function follows TRL's contract:

    def my_reward(prompts, completions, completion_ids, **columns) -> list[float | None]

one value per completion; `completions` are strings for standard prompts and `[{"role": "assistant", "content": ...}]`
for conversational ones; every other dataset column (e.g. `ground_truth`) arrives as a keyword argument. `None` means
"not applicable to this sample" and is skipped in the weighted sum (TRL's semantics). `async def` functions are awaited
concurrently. Select functions with `--reward_funcs accuracy,format` (built-ins) or `module:function`, weight them
with `--reward_weights 1.0,0.2`, and add a trained reward model with `--reward_model_path`.
"""

import asyncio
import importlib
import importlib.util
import inspect
import math
import re
from pathlib import Path

import torch
from accelerate import PartialState
from accelerate.utils import reduce


# ----------------------------------------------------------------------------------------------------------------------
# Errors and conventions. This file imports nothing from the project, so that it can be copied alone; common.py
# imports these from here.
# ----------------------------------------------------------------------------------------------------------------------
class ConfigError(Exception):
    """Bad user input. Scripts report it as one line that names the flag or field, and exit with status 2."""


class TrainingError(ConfigError):
    """A mistake that shows only during training (a reward function that raises or returns the wrong thing): the
    training loop ends (`graceful_interrupt` catches it), the script saves a checkpoint, then reports it as one line."""


def first_line(error: Exception) -> str:
    """The first line of an exception's message, or its type when the message is empty."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def split_list(text: str | None, cast=str) -> list:
    """'accuracy, format' -> ['accuracy', 'format']; empty or None -> []."""
    return [cast(item.strip()) for item in (text or "").split(",") if item.strip()]


def is_conversational(prompt) -> bool:
    return isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt)


def as_completion(prompt, text: str):
    """TRL's convention: conversational prompts get completions as a message list, standard ones as plain text."""
    return [{"role": "assistant", "content": text}] if is_conversational(prompt) else text


def failed_on_any_process(failed: bool) -> bool:
    """True on every process when `failed` is True on any (under `accelerate launch`): all of them stop at one step."""
    state = PartialState()
    if state.num_processes == 1:
        return failed
    return bool(reduce(torch.tensor(float(failed), device=state.device), "sum").item() > 0)


# ----------------------------------------------------------------------------------------------------------------------
# Reward functions
# ----------------------------------------------------------------------------------------------------------------------
ANSWER = re.compile(r"<answer>\s*(.*?)\s*</answer>", flags=re.DOTALL)
FORMAT = re.compile(r".*<answer>\s*[-+]?[0-9]+(?:\.[0-9]+)?\s*</answer>\s*$", flags=re.DOTALL)


def completion_text(completion) -> str:
    """The text of a completion in either format (string, or a list of messages)."""
    return completion if isinstance(completion, str) else completion[-1]["content"]


def extract_answer(text: str) -> str | None:
    """'... <answer> 42 </answer>' -> '42'; None when there is no answer tag."""
    match = ANSWER.search(text)
    return None if match is None else match.group(1).strip()


def accuracy_reward(completions, ground_truth, **kwargs) -> list[float]:
    """1.0 when the extracted answer equals the ground truth, else 0.0."""
    return [
        1.0 if extract_answer(completion_text(c)) == str(answer) else 0.0
        for c, answer in zip(completions, ground_truth)
    ]


def format_reward(completions, **kwargs) -> list[float]:
    """1.0 when the completion ends with <answer>NUMBER</answer>, else 0.0."""
    return [1.0 if FORMAT.fullmatch(completion_text(c).strip()) else 0.0 for c in completions]


BUILTIN_REWARDS = {"accuracy": accuracy_reward, "format": format_reward}


def import_function(spec: str):
    """'package.module:function' or 'path/to/file.py:function'."""
    module_name, _, function_name = spec.rpartition(":")
    try:
        if module_name.endswith(".py"):
            module_spec = importlib.util.spec_from_file_location(Path(module_name).stem, module_name)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
        function = getattr(module, function_name)
    except (ImportError, AttributeError, FileNotFoundError) as error:
        raise ConfigError(f"--reward_funcs: cannot import {spec!r}: {error}") from None
    if not callable(function):
        raise ConfigError(f"--reward_funcs: {spec!r} is not callable")
    return function


def reward_model_text(tokenizer, prompt, completion) -> str:
    """What a reward model reads (when scoring, and when reward_model.py trains it): a conversation through the reward
    model's own chat template, prompt and answer together, or the prompt and completion strings joined. `prompt` may
    be None (preference pairs without a prompt column)."""
    if is_conversational(completion):
        return tokenizer.apply_chat_template((prompt or []) + completion, tokenize=False)
    return (prompt or "") + completion


def reward_model_function(path: str, device, batch_size: int = 32, prepare=None):
    """Score (prompt, completion) pairs with a sequence-classification reward model (num_labels=1).

    Conversational samples go through the reward model's own chat template, prompt and answer together. `prepare`
    readies the loaded model for scoring and returns what to call (default: eval mode, no gradients, on `device`); the
    scripts pass `common.prepare_frozen`, which wraps it in an inference engine under DeepSpeed ZeRO-3.
    """
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
    except (OSError, ValueError) as error:
        raise ConfigError(
            f"--reward_model_path: cannot load a reward model from {path!r}: {first_line(error)}"
        ) from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id
    model = prepare(model) if prepare else model.to(device).eval().requires_grad_(False)

    @torch.no_grad()
    def score(prompts, completions, **kwargs) -> list[float]:
        texts = [reward_model_text(tokenizer, p, c) for p, c in zip(prompts, completions)]
        scores = []
        for start in range(0, len(texts), batch_size):
            enc = tokenizer(
                texts[start : start + batch_size], return_tensors="pt", padding=True, padding_side="right"
            ).to(device)
            scores += model(**enc).logits[:, 0].float().tolist()
        return scores

    score.__name__ = Path(path.rstrip("/")).name
    return score


def load_reward_funcs(reward_funcs: str, reward_model_path: str | None = None, device="cpu", prepare=None) -> dict:
    """{name: function} from --reward_funcs (built-in names or module:function; 'none' for no function) plus the
    reward model of --reward_model_path, if any (`prepare`: see reward_model_function)."""
    functions = {}
    for spec in split_list(reward_funcs):
        if spec == "none":
            continue
        if spec in BUILTIN_REWARDS:
            function = BUILTIN_REWARDS[spec]
        elif ":" in spec:
            function = import_function(spec)
        else:
            raise ConfigError(
                f"--reward_funcs: unknown reward function {spec!r} (built-in: {', '.join(BUILTIN_REWARDS)}; or "
                "module:function)"
            )
        functions[function.__name__] = function
    if reward_model_path:
        function = reward_model_function(reward_model_path, device, prepare=prepare)
        functions[function.__name__] = function
    if not functions:
        raise ConfigError("--reward_funcs: no reward function selected (and no --reward_model_path)")
    return functions


def reward_weights(weights: str, reward_funcs: dict) -> torch.Tensor:
    """--reward_weights as a tensor; empty means 1.0 for every function."""
    try:
        values = split_list(weights, float) or [1.0] * len(reward_funcs)
    except ValueError:
        raise ConfigError(f"--reward_weights: expected comma-separated numbers, got {weights!r}") from None
    if len(values) != len(reward_funcs):
        raise ConfigError(
            f"--reward_weights: {len(values)} weights for {len(reward_funcs)} reward functions "
            f"({', '.join(reward_funcs)})"
        )
    if not all(math.isfinite(value) for value in values):
        raise ConfigError(f"--reward_weights: expected finite numbers, got {weights!r}")
    return torch.tensor(values)


TRL_ARGUMENTS = ("prompts", "completions", "completion_ids")


def required_columns(function) -> list[str]:
    """The dataset columns a reward function needs: the parameters it declares without a default, other than TRL's
    prompts, completions and completion_ids: `accuracy_reward(completions, ground_truth, **kwargs)` needs
    ground_truth."""
    parameters = inspect.signature(function).parameters.values()
    return [
        p.name
        for p in parameters
        if p.default is p.empty and p.name not in TRL_ARGUMENTS and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]


def check_columns(reward_funcs: dict, dataset, flag: str = "--dataset_name"):
    """Every column each reward function needs is in the dataset: checked before training, not at its first step."""
    for name, function in reward_funcs.items():
        for column in required_columns(function):
            if column not in dataset.column_names:
                raise ConfigError(
                    f"{flag}: the dataset has no {column!r} column, which reward function {name} needs "
                    f"(columns: {dataset.column_names})"
                )


def reward_values(name: str, values, num_completions: int) -> torch.Tensor:
    """What reward function `name` returned (or raised), as one float per completion, NaN for None; anything else is a
    TrainingError naming the function."""
    if isinstance(values, BaseException):
        raise TrainingError(f"reward function {name}: raised {type(values).__name__}: {first_line(values)}")
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise TrainingError(f"reward function {name}: returned {values!r}, not a list with one value per completion")
    values = list(values)
    if len(values) != num_completions:
        raise TrainingError(f"reward function {name}: returned {len(values)} values for {num_completions} completions")
    for i, value in enumerate(values):
        if value is not None and (not isinstance(value, (int, float)) or not math.isfinite(value)):
            raise TrainingError(
                f"reward function {name}: returned {value!r} for completion {i} (expected a finite number or None)"
            )
    return torch.tensor([math.nan if value is None else float(value) for value in values])


def compute_rewards(
    reward_funcs: dict,
    weights: torch.Tensor,
    prompts: list,
    completion_texts: list[str],
    completion_ids: list[list[int]],
    columns: dict,
):
    """Each function's rewards (B, F), with NaN where a function returned None, and their weighted sum (B,) over the
    functions that apply. A completion no function applies to is unscorable: its reward is NaN (not 0), which the
    scripts leave out of baselines and statistics and give advantage 0, as TRL does.

    Sync functions run in order; `async` ones are awaited concurrently. A function that raises, or returns anything
    but one finite number or None per completion, stops the run (a TrainingError naming it, on every process alike:
    the script saves a checkpoint first).
    """
    completions = [as_completion(p, t) for p, t in zip(prompts, completion_texts)]
    kwargs = dict(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)
    results = {}
    pending = {}
    for name, function in reward_funcs.items():
        if inspect.iscoroutinefunction(function):
            pending[name] = function
        else:
            try:
                results[name] = function(**kwargs)
            except Exception as error:  # the user's code: kept, to be reported with the function's name
                results[name] = error
    if pending:

        async def run_all():
            return await asyncio.gather(*(function(**kwargs) for function in pending.values()), return_exceptions=True)

        results.update(zip(pending, asyncio.run(run_all())))
    per_func = torch.full((len(prompts), len(reward_funcs)), math.nan)
    problem = None
    try:
        for j, name in enumerate(reward_funcs):
            per_func[:, j] = reward_values(name, results[name], len(prompts))
    except TrainingError as error:
        problem = str(error)
    if failed_on_any_process(problem is not None):  # every process stops at the same step
        raise TrainingError(problem or "a reward function failed on another process (its line is there)")
    rewards = (per_func * weights).nansum(1)
    rewards[per_func.isnan().all(1)] = math.nan  # unscorable
    return rewards, per_func
