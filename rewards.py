"""Reward functions, reward-model scoring, and their weighted sum: the reward helpers every script shares.

A reward function follows TRL's contract:

    def my_reward(prompts, completions, completion_ids, **columns) -> list[float | None]

one value per completion. `completions` are strings for string prompts and [{"role": "assistant", "content": ...}]
for conversations; every other dataset column (e.g. `solution`) arrives as a keyword argument. None means "does not
apply to this completion": it is left out of the weighted sum, and a completion no function applies to is unscorable
(NaN), which the scripts leave out of baselines and statistics, as TRL does.

    --reward_funcs accuracy format             built-in names (TRL's too: accuracy_reward, think_format_reward, ...)
    --reward_funcs my_rewards.py:brevity       a function in a file, or TRL's dotted my_pkg.my_module.brevity
    --reward_weights 1.0 0.2                   one weight per function (default 1.0 each)
    --reward_model_path my-rm                  a sequence classifier with one label, added to the functions

This file imports nothing from the project.
"""

import importlib
import importlib.util
import inspect
import math
import re
import sys
from pathlib import Path

import torch


class RewardError(ValueError):
    """A reward function that cannot be used: unknown, missing a column, or returning the wrong values. The scripts
    print it as one line and exit with status 2."""


# ----------------------------------------------------------------------------------------------------------------------
# Built-in reward functions
# ----------------------------------------------------------------------------------------------------------------------
ANSWER = re.compile(r"<answer>\s*(.*?)\s*</answer>", flags=re.DOTALL)
FORMAT = re.compile(r".*<answer>\s*[-+]?[0-9]+(?:\.[0-9]+)?\s*</answer>\s*$", flags=re.DOTALL)
THINK_FORMAT = re.compile(r"<think>(?!.*<think>).*?</think>.*", flags=re.DOTALL)


def text_of(completion) -> str:
    return completion if isinstance(completion, str) else completion[-1]["content"]


def extract_answer(text: str) -> str | None:
    """'... <answer> 42 </answer>' -> '42'; None without an answer tag."""
    match = ANSWER.search(text)
    return None if match is None else match.group(1).strip()


def same_answer(answer: str | None, truth) -> bool:
    """'84' matches '84', 84 and 84.0."""
    try:
        return answer == str(truth) or float(answer) == float(truth)
    except (TypeError, ValueError):
        return False


def accuracy_reward(completions, solution=None, ground_truth=None, **kwargs) -> list[float | None]:
    r"""1.0 where the answer is right, else 0.0; None where the row has no answer to check against.

    With a `solution` column, TRL's accuracy_reward: math-verify checks the completion's \boxed{} (or other LaTeX)
    answer against the LaTeX solution as math; None where the solution does not parse. One addition to TRL's: an
    answer in <answer>...</answer> is verified when there is no \boxed{}. With `ground_truth`, the arithmetic task's
    check: the <answer>N</answer> text equals it."""
    if solution is not None:
        return [
            None if gold is None else verified(text_of(c), gold)
            for c, gold in zip(completions, solution)
        ]
    return [
        None if truth is None else float(same_answer(extract_answer(text_of(c)), truth))
        for c, truth in zip(completions, ground_truth)
    ]


accuracy_reward.one_of_columns = ("solution", "ground_truth")


def verified(text: str, gold: str) -> float | None:
    r"""math-verify with TRL's settings: `text`'s first \boxed{} (or LaTeX) answer equals `gold` as math."""
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import LatexExtractionConfig, parse, verify

    gold_parsed = parse(
        gold, parsing_timeout=None
    )  # math-verify's timeouts use signal.alarm: off, as in TRL
    if not gold_parsed:
        return None
    answer = extract_answer(text)
    if "\\boxed" not in text and answer is not None:
        text = f"\\boxed{{{answer}}}"
    latex = LatexExtractionConfig(
        normalization_config=NormalizationConfig(units=True),
        boxed_match_priority=0,
        try_extract_without_anchor=False,
    )
    parsed = parse(
        text, extraction_config=[latex], extraction_mode="first_match", parsing_timeout=None
    )
    return float(verify(gold_parsed, parsed, timeout_seconds=None))


def reasoning_accuracy_reward(completions, **kwargs) -> list[float | None]:
    """TRL's reasoning_accuracy_reward: `accuracy_reward` of the text after the last </think>; 0.0 without one."""
    answers = [
        text_of(c).split("</think>")[-1] if "</think>" in text_of(c) else None for c in completions
    ]
    scores = accuracy_reward([a or "" for a in answers], **kwargs)
    return [0.0 if a is None else score for a, score in zip(answers, scores)]


reasoning_accuracy_reward.one_of_columns = accuracy_reward.one_of_columns


def format_reward(completions, **kwargs) -> list[float]:
    """1.0 when the completion ends with <answer>NUMBER</answer>, else 0.0."""
    return [1.0 if FORMAT.fullmatch(text_of(c).strip()) else 0.0 for c in completions]


def think_format_reward(completions, **kwargs) -> list[float]:
    """TRL's think_format_reward: 1.0 when the completion opens with <think>, closes it, and opens no second one."""
    return [1.0 if THINK_FORMAT.match(text_of(c)) else 0.0 for c in completions]


def get_soft_overlong_punishment(max_completion_len: int, soft_punish_cache: int):
    """TRL's soft overlong punishment (DAPO, Eq. 13): 0 up to max_completion_len − soft_punish_cache tokens, then
    linearly down to −1 at max_completion_len."""

    def soft_overlong_punishment_reward(completion_ids, **kwargs) -> list[float]:
        free = max_completion_len - soft_punish_cache
        return [
            0.0 if n <= free else max((free - n) / max(soft_punish_cache, 1), -1.0)
            for n in map(len, completion_ids)
        ]

    return soft_overlong_punishment_reward


BUILTIN = {
    "accuracy": accuracy_reward,
    "accuracy_reward": accuracy_reward,
    "format": format_reward,
    "think_format_reward": think_format_reward,
    "reasoning_accuracy_reward": reasoning_accuracy_reward,
}


# ----------------------------------------------------------------------------------------------------------------------
# Loading: built-in names, a user's function, a reward model
# ----------------------------------------------------------------------------------------------------------------------
def import_function(spec: str):
    """'path/to/file.py:function', 'package.module:function' or TRL's dotted 'package.module.function'; modules are
    looked up in the current folder too."""
    module_name, _, name = spec.rpartition(":") if ":" in spec else spec.rpartition(".")
    try:
        if module_name.endswith(".py"):
            module_spec = importlib.util.spec_from_file_location(
                Path(module_name).stem, module_name
            )
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            sys.path.insert(0, "")
            module = importlib.import_module(module_name)
    except Exception as error:  # a missing file or module, or an error inside it
        raise RewardError(
            f"--reward_funcs: cannot import {spec!r}: {type(error).__name__}: {error}"
        ) from None
    if not callable(getattr(module, name, None)):
        raise RewardError(f"--reward_funcs: {module_name} has no function {name!r}")
    return getattr(module, name)


def reward_model_function(path: str, device, prepare=None, batch_size: int = 32):
    """Score (prompt, completion) pairs with a sequence classifier with one label (a reward_model.py output). Each pair
    goes through the reward model's own tokenizer (and chat template), so it need not share the policy's.
    `prepare(model)` readies it for scoring (default: eval mode on `device`)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    try:  # whatever goes wrong while loading it is one line naming the flag
        model = AutoModelForSequenceClassification.from_pretrained(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as error:
        reason = (str(error).strip() or type(error).__name__).splitlines()[
            0
        ]  # the library's first line
        raise RewardError(f"--reward_model_path {path}: {reason}") from None
    if model.config.num_labels != 1:
        raise RewardError(
            f"--reward_model_path: {path} has {model.config.num_labels} labels; a reward model has one"
        )
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id
    model = prepare(model) if prepare else model.to(device).eval().requires_grad_(False)

    @torch.no_grad()
    def score(prompts, completions, **kwargs) -> list[float]:
        texts = [reward_model_text(tokenizer, p, c) for p, c in zip(prompts, completions)]
        scores = []
        for start in range(0, len(texts), batch_size):
            enc = tokenizer(
                texts[start : start + batch_size],
                return_tensors="pt",
                padding=True,
                padding_side="right",
            )
            scores += model(**enc.to(device)).logits[:, 0].float().tolist()
        return scores

    score.__name__ = Path(path.rstrip("/")).name
    return score


def reward_model_text(tokenizer, prompt, completion) -> str:
    """What a reward model reads: a conversation through its chat template, or prompt and completion joined."""
    if isinstance(completion, list):
        return tokenizer.apply_chat_template((prompt or []) + completion, tokenize=False)
    return (prompt or "") + completion


def load_reward_funcs(args, device="cpu", prepare=None) -> dict:
    """{name: function} from --reward_funcs ('none' for no function) and --reward_model_path. TRL's
    get_soft_overlong_punishment penalizes the last fifth of --max_completion_length."""
    specs, length = args.reward_funcs, args.max_completion_length
    functions = {}
    for spec in (
        s.strip() for item in specs for s in item.split(",") if s.strip() and s.strip() != "none"
    ):
        if spec in BUILTIN:
            function = BUILTIN[spec]
        elif spec == "get_soft_overlong_punishment":
            function = get_soft_overlong_punishment(length, length // 5)
        elif ":" in spec or "." in spec:
            function = import_function(spec)
        else:
            raise RewardError(
                f"--reward_funcs: unknown reward function {spec!r} (built in: {', '.join(BUILTIN)})"
            )
        functions[getattr(function, "__name__", spec)] = function
    if args.reward_model_path:
        function = reward_model_function(args.reward_model_path, device, prepare)
        functions[function.__name__] = function
    if not functions:
        raise RewardError("--reward_funcs: no reward function (and no --reward_model_path)")
    return functions


def reward_weights(weights: list[str], reward_funcs: dict) -> torch.Tensor:
    """--reward_weights as a tensor; none given means 1.0 for every function."""
    try:
        values = [float(w) for item in weights for w in item.split(",") if w.strip()] or [
            1.0
        ] * len(reward_funcs)
    except ValueError:
        raise RewardError(
            f"--reward_weights: expected numbers, got {' '.join(weights)!r}"
        ) from None
    if len(values) != len(reward_funcs):
        raise RewardError(
            f"--reward_weights: {len(values)} weights for {len(reward_funcs)} reward functions"
        )
    return torch.tensor(values)


def check_columns(reward_funcs: dict, dataset, split: str):
    """Every reward function can be called as `compute_rewards` calls it, with the dataset split's columns (if any): a
    column it needs (a parameter without a default, or one of its `one_of_columns`), or a keyword it does not take
    (TRL's functions end with **kwargs), is said before training rather than at its first step."""
    columns = dataset.column_names if dataset is not None else None
    for name, function in reward_funcs.items() if columns is not None else ():
        one_of = getattr(function, "one_of_columns", ())
        if one_of and not set(one_of) & set(columns):
            raise RewardError(
                f"reward function {name} needs a column {' or '.join(one_of)}; the {split} split has {columns}"
            )
        keywords = [
            "prompts",
            "completions",
            "completion_ids",
            *(c for c in columns if c != "prompt"),
        ]
        try:
            inspect.signature(function).bind(**dict.fromkeys(keywords))
        except TypeError as error:  # a column it needs is missing, or it takes no **kwargs
            raise RewardError(
                f"reward function {name} called with {keywords} (the {split} split's): {error}"
            ) from None


# ----------------------------------------------------------------------------------------------------------------------
# The weighted sum
# ----------------------------------------------------------------------------------------------------------------------
def as_completion(prompt, text: str):
    """(prompt, completion) as reward functions see them (TRL's convention): a conversation gets its completion as an
    assistant message; one that ends with the assistant's turn is continued, so that turn's text starts it."""
    if isinstance(prompt, str):
        return prompt, text
    if prompt and prompt[-1]["role"] == "assistant":
        return prompt[:-1], [{"role": "assistant", "content": prompt[-1]["content"] + text}]
    return prompt, [{"role": "assistant", "content": text}]


def compute_rewards(
    reward_funcs: dict,
    weights,
    prompts: list,
    texts: list[str],
    completion_ids: list,
    columns: dict,
):
    """Each function's rewards (B, F), NaN where it returned None, and their weighted sum (B,), NaN where no function
    applies. A function that returns anything but one number or None per completion is a RewardError naming it."""
    prompts, completions = map(list, zip(*(as_completion(p, t) for p, t in zip(prompts, texts))))
    per_func = torch.full((len(prompts), len(reward_funcs)), math.nan)
    for j, (name, function) in enumerate(reward_funcs.items()):
        values = function(
            prompts=prompts, completions=completions, completion_ids=completion_ids, **columns
        )
        values = (
            values.tolist() if hasattr(values, "tolist") else values
        )  # a numpy array, a tensor
        if not isinstance(values, (list, tuple)):
            raise RewardError(
                f"reward function {name} returned {str(values)[:80]}: expected a list, one value each"
            )
        if len(values) != len(prompts):
            raise RewardError(
                f"reward function {name} returned {len(values)} values for {len(prompts)} completions"
            )
        try:
            numbers = [math.nan if v is None else float(v) for v in values]
        except (TypeError, ValueError):
            numbers = [math.inf]
        if not all(v is None or math.isfinite(n) for v, n in zip(values, numbers)):
            raise RewardError(
                f"reward function {name} returned {values[:3]}...: expected finite numbers or None"
            )
        per_func[:, j] = torch.tensor(numbers)
    rewards = (per_func * weights).nansum(1)
    rewards[per_func.isnan().all(1)] = math.nan  # unscorable
    return rewards, per_func
