"""Reward functions, reward-model scoring and their weighted sum; no project imports.

A reward function follows TRL's contract, one value per completion:

    def my_reward(prompts, completions, completion_ids, **columns) -> list[float | None]

`completions` are strings, or [{"role": "assistant", "content": ...}] after a conversation;
other columns (e.g. `solution`) are keyword arguments. None means "does not apply": the
weighted sum leaves it out, and is NaN where none applies; the scripts leave NaN out of
baselines and statistics, as TRL does. The flags that choose them, --reward_funcs,
--reward_weights and --reward_model_path: docs/trl-rewards-and-recipe.md.
"""

import asyncio
import importlib.util
import inspect
import math
import re
import sys
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, logging


class RewardError(ValueError):
    """An unusable reward function or weight: one line, exit status 2."""


# ==== Built-in reward functions ====
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
    """'84' matches '84', 84 and 84.0, and a list of accepted answers that holds one of them."""
    truths = truth if isinstance(truth, list) else [truth]
    try:
        return answer in map(str, truths) or any(float(answer) == float(t) for t in truths)
    except (TypeError, ValueError):
        return False


def verified(text: str, gold: str) -> float | None:
    r"""math-verify as in TRL: `text`'s first \boxed{} (or LaTeX) answer is `gold`."""
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import LatexExtractionConfig, parse, verify

    gold_parsed = parse(gold, parsing_timeout=None)  # no signal.alarm, as in TRL
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


def accuracy_reward(completions, solution=None, ground_truth=None, **kwargs) -> list[float | None]:
    r"""1.0 where the answer is right, else 0.0; None where there is nothing to check.

    With a `solution` column, TRL's: math-verify compares the \boxed{} (or LaTeX) answer
    with it, or the <answer> text where there is no \boxed{} (our addition). With
    `ground_truth`: the <answer>N</answer> text equals it."""
    if solution is not None:
        return [
            None if gold is None else verified(text_of(c), gold)
            for c, gold in zip(completions, solution)
        ]
    return [
        None if truth is None else float(same_answer(extract_answer(text_of(c)), truth))
        for c, truth in zip(completions, ground_truth)
    ]


def reasoning_accuracy_reward(completions, **kwargs) -> list[float | None]:
    """TRL's: `accuracy_reward` after the last </think>; 0.0 without one."""
    texts = [text_of(c) for c in completions]
    answers = [t.split("</think>")[-1] if "</think>" in t else None for t in texts]
    scores = accuracy_reward([a or "" for a in answers], **kwargs)
    return [0.0 if a is None else score for a, score in zip(answers, scores)]


accuracy_reward.one_of_columns = ("solution", "ground_truth")
reasoning_accuracy_reward.one_of_columns = accuracy_reward.one_of_columns


def format_reward(completions, **kwargs) -> list[float]:
    """1.0 if the completion ends with <answer>NUMBER</answer>, else 0.0."""
    return [1.0 if FORMAT.fullmatch(text_of(c).strip()) else 0.0 for c in completions]


def think_format_reward(completions, **kwargs) -> list[float]:
    """TRL's: 1.0 if the completion opens <think>, closes it, and opens no other."""
    return [1.0 if THINK_FORMAT.match(text_of(c)) else 0.0 for c in completions]


def get_soft_overlong_punishment(max_completion_len: int, soft_punish_cache: int):
    """TRL's soft overlong punishment (DAPO, Eq. 13): 0 up to max_completion_len −
    soft_punish_cache tokens, then linearly down to −1 at max_completion_len."""

    def soft_overlong_punishment_reward(completion_ids, **kwargs) -> list[float]:
        free = max_completion_len - soft_punish_cache
        ramp = max(soft_punish_cache, 1)
        lengths = [len(ids) for ids in completion_ids]
        return [0.0 if n <= free else max((free - n) / ramp, -1.0) for n in lengths]

    return soft_overlong_punishment_reward


BUILTIN = {
    "accuracy": accuracy_reward,
    "accuracy_reward": accuracy_reward,
    "format": format_reward,
    "think_format_reward": think_format_reward,
    "reasoning_accuracy_reward": reasoning_accuracy_reward,
}


# ==== Loading: built-in names, a user's function, a reward model ====
def import_function(spec: str):
    """'path/to/file.py:function', 'package.module:function' or TRL's 'package.module.function'."""
    module_name, _, name = spec.rpartition(":" if ":" in spec else ".")
    try:
        if module_name.endswith(".py"):
            stem = Path(module_name).stem
            module_spec = importlib.util.spec_from_file_location(stem, module_name)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            sys.path.insert(0, "")  # the current folder's modules too
            module = importlib.import_module(module_name)
    except (OSError, ImportError, SyntaxError) as error:  # missing or unparsable: not a bug in it
        raise RewardError(f"--reward_funcs: cannot import {spec!r}: {error!r}") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise RewardError(f"--reward_funcs: {module_name} has no function {name!r}")
    return function


def reward_model_function(path: str, device, prepare=None, batch_size: int = 32):
    """Scores (prompt, completion) pairs with a one-label classifier and its own tokenizer."""
    try:  # a missing model or files that do not parse, as one line; other errors keep a traceback
        model = AutoModelForSequenceClassification.from_pretrained(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as error:
        reason = (str(error).strip() or type(error).__name__).splitlines()[0]
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
            batch = texts[start : start + batch_size]
            enc = tokenizer(batch, return_tensors="pt", padding=True, padding_side="right")
            scores += model(**enc.to(device)).logits[:, 0].float().tolist()
        return scores

    score.__name__ = Path(path.rstrip("/")).name
    return score


def reward_model_text(tokenizer, prompt, completion) -> str:
    """A conversation in the reward model's chat template, or prompt + completion."""
    if isinstance(completion, list):
        return tokenizer.apply_chat_template((prompt or []) + completion, tokenize=False)
    return (prompt or "") + completion


def load_reward_funcs(args, device="cpu", prepare=None) -> dict:
    """{name: function} from --reward_funcs ('none': none) and --reward_model_path."""
    specs = [s.strip() for item in args.reward_funcs for s in item.split(",")]
    length = args.max_completion_length
    functions = {}
    for spec in [s for s in specs if s not in ("", "none")]:
        if spec in BUILTIN:
            function = BUILTIN[spec]
        elif spec == "get_soft_overlong_punishment":
            function = get_soft_overlong_punishment(length, length // 5)  # TRL's: the last fifth
        elif ":" in spec or "." in spec:
            function = import_function(spec)
        else:
            raise RewardError(
                f"--reward_funcs: unknown reward function {spec!r} (built in: {', '.join(BUILTIN)})"
            )
        name = getattr(function, "__name__", spec)
        functions[spec if name in functions else name] = function  # two files' `score`: both
    if args.reward_model_path:
        function = reward_model_function(args.reward_model_path, device, prepare)
        functions[function.__name__] = function
    if not functions:
        raise RewardError("--reward_funcs: no reward function (and no --reward_model_path)")
    return functions


def reward_weights(weights: list[str], reward_funcs: dict) -> torch.Tensor:
    """--reward_weights as a tensor; none given means 1.0 for every function."""
    try:
        values = [float(w) for item in weights for w in item.split(",") if w.strip()]
    except ValueError:
        raise RewardError(f"--reward_weights: expected numbers: {' '.join(weights)!r}") from None
    values = values or [1.0] * len(reward_funcs)
    if len(values) != len(reward_funcs):
        raise RewardError(
            f"--reward_weights: {len(values)} weights for {len(reward_funcs)} functions"
        )
    return torch.tensor(values)


def check_columns(reward_funcs: dict, dataset, split: str):
    """Fails before training on a missing column (or `one_of_columns`), or no **kwargs."""
    if dataset is None:  # no held-out split
        return
    columns = dataset.column_names
    keywords = ["prompts", "completions", "completion_ids", *(c for c in columns if c != "prompt")]
    for name, function in reward_funcs.items():
        one_of = getattr(function, "one_of_columns", ())
        if one_of and set(one_of).isdisjoint(columns):
            raise RewardError(
                f"reward function {name} needs a column {' or '.join(one_of)}; the {split} split has {columns}"
            )
        try:
            inspect.signature(function).bind(**dict.fromkeys(keywords))
        except TypeError as error:  # a missing column, or no **kwargs
            raise RewardError(
                f"reward function {name} called with {keywords} (the {split} split's): {error}"
            ) from None


# ==== The weighted sum ====
def as_completion(prompt, text: str):
    """(prompt, completion) as TRL's reward functions see them: after a conversation, an
    assistant message, begun by the prompt's last turn if it is the assistant's."""
    if isinstance(prompt, str):
        return prompt, text
    if prompt and prompt[-1]["role"] == "assistant":
        return prompt[:-1], [{"role": "assistant", "content": prompt[-1]["content"] + text}]
    return prompt, [{"role": "assistant", "content": text}]


def compute_rewards(reward_funcs, weights, prompts, texts, completion_ids, columns):
    """Per function (B, F), NaN for None, and the weighted sum (B,), NaN where none applies."""
    pairs = [as_completion(p, t) for p, t in zip(prompts, texts)]
    prompts, completions = map(list, zip(*pairs))
    per_func = torch.full((len(prompts), len(reward_funcs)), math.nan)
    for j, (name, function) in enumerate(reward_funcs.items()):
        values = function(
            prompts=prompts, completions=completions, completion_ids=completion_ids, **columns
        )
        values = asyncio.run(values) if inspect.iscoroutine(values) else values  # async def
        if hasattr(values, "tolist"):  # a numpy array, a tensor
            values = values.tolist()
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
            numbers = [math.inf] * len(values)  # not numbers: refused below
        if not all(v is None or math.isfinite(n) for v, n in zip(values, numbers)):
            raise RewardError(
                f"reward function {name} returned {values[:3]}...: expected finite numbers or None"
            )
        per_func[:, j] = torch.tensor(numbers)
    rewards = (per_func * weights).nansum(1)
    rewards[per_func.isnan().all(1)] = math.nan  # unscorable
    if rewards.isnan().all():  # as TRL warns: such a batch has no learning signal
        logging.get_logger(__name__).warning_once("warning: no reward function scored the batch")
    return rewards, per_func
