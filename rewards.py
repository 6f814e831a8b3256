"""Reward functions, reward-model scoring, and how several rewards combine into one scalar per completion; and the
checked loading of a model (`load_pretrained`), which the reward model and common.py's loaders share.

A reward function follows TRL's contract:

    def my_reward(prompts, completions, completion_ids, **columns) -> list[float | None]

one value per completion (a list, a numpy array or a 1-D tensor of Python, numpy or torch numbers or bools, as TRL
takes); `completions` are strings for standard prompts and `[{"role": "assistant", "content": ...}]` for
conversational ones; every other dataset column (e.g. `solution`) arrives as a keyword argument. `None` means
"not applicable to this sample" and is skipped in the weighted sum (TRL's semantics). `async def` functions (any that
return an awaitable) are awaited concurrently. Select functions with `--reward_funcs accuracy_reward format` (TRL's
list) or `--reward_funcs accuracy,format`: built-in names, `module:function`, `path/to/file.py:function` or TRL's
dotted `my_pkg.my_module.my_reward`. Weight them with `--reward_weights 1.0 0.2` (or `1.0,0.2`), and add a trained
reward model with `--reward_model_path`.
"""

import asyncio
import importlib
import importlib.util
import inspect
import json
import math
import os
import re
import sys
import threading
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


def split_list(text: str | list[str] | None, cast=str) -> list:
    """'accuracy, format' -> ['accuracy', 'format']; a list (TRL's `--flag a b` form, or a YAML list) has each of its
    items split so; empty or None -> []."""
    items = [text or ""] if isinstance(text, str) or text is None else text
    return [cast(item.strip()) for text in items for item in str(text).split(",") if item.strip()]


def is_conversational(prompt) -> bool:
    return isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt)


def reward_inputs(prompt, text: str):
    """(prompt, completion) as reward functions see them, TRL's convention: a conversational prompt gets its completion
    as an assistant message, a standard one as plain text. A conversation that ends with the assistant's turn is
    continued (not answered): that turn's text starts the completion, and the prompt is the conversation before it."""
    if not is_conversational(prompt):
        return prompt, text
    if prompt and prompt[-1]["role"] == "assistant":
        return prompt[:-1], [{"role": "assistant", "content": prompt[-1]["content"] + text}]
    return prompt, [{"role": "assistant", "content": text}]


def as_completion(prompt, text: str):
    return reward_inputs(prompt, text)[1]


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


def same_answer(answer: str | None, truth) -> bool:
    """'84' matches '84', 84 and 84.0 (a csv column with an empty cell is read as floats)."""
    if answer == str(truth):
        return True
    try:
        return float(answer) == float(truth)
    except (TypeError, ValueError):
        return False


def accuracy_reward(completions, solution=None, ground_truth=None, **kwargs) -> list[float | None]:
    r"""1.0 where a completion's answer is right, else 0.0; None (not applicable) where the row has no answer.

    With a `solution` column, TRL's accuracy_reward: math-verify parses the gold solution (LaTeX, e.g. "$\frac{1}{2}$";
    None where it does not parse, so the row is skipped) and the completion's first \boxed{} or other LaTeX answer,
    and checks that the two are equal as math (\boxed{0.5} is right for \frac{1}{2}). One addition to TRL's: a
    completion without \boxed{} whose answer is in <answer>...</answer> has that answer verified, so that the
    arithmetic task's answer format (and the embedded model) scores on math datasets too. Without `solution`, the
    arithmetic task's own check: the <answer>N</answer> text equals `ground_truth` (84 matches "84" and 84.0)."""
    if solution is not None:
        return [None if gold is None else verified(completion_text(c), gold) for c, gold in zip(completions, solution)]
    return [
        None if answer is None else float(same_answer(extract_answer(completion_text(c)), answer))
        for c, answer in zip(completions, ground_truth)
    ]


accuracy_reward.one_of_columns = ("solution", "ground_truth")  # the dataset needs one of them (`check_columns`)


def verified(text: str, gold: str) -> float | None:
    r"""math-verify with TRL's settings: `text`'s first \boxed{} (or LaTeX) answer equals `gold` as math; None when
    `gold` does not parse."""
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import LatexExtractionConfig, parse, verify

    # math-verify times out with signal.alarm, which only the main thread may use (TRL turns the timeouts off so too)
    main_thread = threading.current_thread() is threading.main_thread()
    parsing_timeout, verify_timeout = (10, 5) if main_thread else (None, None)
    gold_parsed = parse(gold, parsing_timeout=parsing_timeout)
    if not gold_parsed:
        return None
    answer = extract_answer(text)
    if "\\boxed" not in text and answer is not None:
        text = f"\\boxed{{{answer}}}"
    latex = LatexExtractionConfig(
        normalization_config=NormalizationConfig(units=True), boxed_match_priority=0, try_extract_without_anchor=False
    )
    answer_parsed = parse(
        text, extraction_config=[latex], extraction_mode="first_match", parsing_timeout=parsing_timeout
    )
    return float(verify(gold_parsed, answer_parsed, timeout_seconds=verify_timeout))


def reasoning_accuracy_reward(completions, reasoning_delimiters=None, **kwargs) -> list[float | None]:
    """TRL's reasoning_accuracy_reward: `accuracy_reward` of the text after the reasoning (after the last
    `</think>`, or another of `reasoning_delimiters`); 0.0 for a completion whose reasoning never ends."""
    delimiters = reasoning_delimiters or ["</think>"]
    answers = []
    for completion in completions:
        text = completion_text(completion)
        delimiter = next((d for d in delimiters if d in text), None)
        answers.append(None if delimiter is None else text.split(delimiter)[-1])
    scores = accuracy_reward([answer or "" for answer in answers], **kwargs)
    return [0.0 if answer is None else score for answer, score in zip(answers, scores)]


reasoning_accuracy_reward.one_of_columns = accuracy_reward.one_of_columns


def format_reward(completions, **kwargs) -> list[float]:
    """1.0 when the completion ends with <answer>NUMBER</answer>, else 0.0."""
    return [1.0 if FORMAT.fullmatch(completion_text(c).strip()) else 0.0 for c in completions]


THINK_FORMAT = re.compile(r"<think>(?!.*<think>).*?</think>.*", flags=re.DOTALL)


def think_format_reward(completions, **kwargs) -> list[float]:
    """TRL's think_format_reward: 1.0 when the completion starts with <think>, closes it with </think> and opens no
    second <think>, else 0.0."""
    return [1.0 if THINK_FORMAT.match(completion_text(c)) else 0.0 for c in completions]


def get_soft_overlong_punishment(max_completion_len: int, soft_punish_cache: int):
    """TRL's soft overlong punishment (DAPO, Eq. 13): 0 up to max_completion_len − soft_punish_cache tokens, then down
    linearly to −1 at max_completion_len, and −1 beyond."""

    def soft_overlong_punishment_reward(completion_ids, **kwargs) -> list[float]:
        free = max_completion_len - soft_punish_cache
        return [
            0.0 if n <= free else max((free - n) / max(soft_punish_cache, 1), -1.0) for n in map(len, completion_ids)
        ]

    return soft_overlong_punishment_reward


BUILTIN_REWARDS = {  # ours, and TRL's names (its GRPO script's registry)
    "accuracy": accuracy_reward,
    "accuracy_reward": accuracy_reward,
    "format": format_reward,
    "think_format_reward": think_format_reward,
    "reasoning_accuracy_reward": reasoning_accuracy_reward,
}


def import_function(spec: str):
    """'package.module:function', 'path/to/file.py:function', or TRL's dotted 'package.module.function'. Modules are
    looked up in the current folder too, as TRL's scripts do."""
    if ":" in spec:
        module_name, _, function_name = spec.rpartition(":")
    else:
        module_name, _, function_name = spec.rpartition(".")
        if function_name == "py":
            raise ConfigError(f"--reward_funcs: {spec!r} names a file, not a function: {spec}:function")
    try:
        if module_name.endswith(".py"):
            module_spec = importlib.util.spec_from_file_location(Path(module_name).stem, module_name)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            sys.path.insert(0, os.getcwd())
            try:
                module = importlib.import_module(module_name)
            finally:
                sys.path.remove(os.getcwd())
    except SyntaxError as error:
        raise ConfigError(
            f"--reward_funcs: cannot import {spec!r}: {error.filename}:{error.lineno}: {error.msg}"
        ) from None
    except FileNotFoundError:
        raise ConfigError(f"--reward_funcs: cannot import {spec!r}: no such file: {module_name}") from None
    except Exception as error:  # whatever the module raises while it loads (an import inside it, its own code)
        raise ConfigError(
            f"--reward_funcs: cannot import {spec!r}: {type(error).__name__}: {first_line(error)}"
        ) from None
    if not hasattr(module, function_name):
        raise ConfigError(f"--reward_funcs: {module_name} has no function {function_name!r}")
    function = getattr(module, function_name)
    if not callable(function) or inspect.isclass(function):
        raise ConfigError(f"--reward_funcs: {spec!r} is a {type(function).__name__}, not a function")
    return function


def reward_model_text(tokenizer, prompt, completion) -> str:
    """What a reward model reads (when scoring, and when reward_model.py trains it): a conversation through the reward
    model's own chat template, prompt and answer together, or the prompt and completion strings joined. `prompt` may
    be None (preference pairs without a prompt column)."""
    if is_conversational(completion):
        return tokenizer.apply_chat_template((prompt or []) + completion, tokenize=False)
    return (prompt or "") + completion


def model_folder_problem(path: str) -> str | None:
    """Why the local `path` cannot hold a model (a file, an empty folder, a folder without config.json, such as a
    tokenizer alone), or None: a model folder, a LoRA adapter folder, or a hub id."""
    folder = Path(path).expanduser()
    if not folder.exists():
        return "no such folder" if path.startswith((".", "/", "~")) else None
    if folder.is_file():
        return "it is a file, not a model folder"
    files = sorted(f.name for f in folder.iterdir())
    if not files:
        return "the folder is empty"
    if not {"config.json", "adapter_config.json"} & set(files):
        return f"no config.json, so no model in it (it holds {', '.join(files[:4])}{', ...' if len(files) > 4 else ''})"
    return None


def load_pretrained(auto_class, path: str, flag: str, what: str = "a model", **kwargs):
    """`auto_class.from_pretrained(path, **kwargs)` and the names of the weights that were not in the checkpoint (they
    start random: the caller says whether that is expected). A LoRA adapter folder for the same kind of model is merged
    into its base model. A path that cannot hold a model (`model_folder_problem`), an adapter for another kind of model,
    a weight whose shape differs from the checkpoint's (a classifier with another label count) and every load error
    are one ConfigError naming `flag`."""
    import transformers

    def refuse(reason: str):
        raise ConfigError(f"{flag}: cannot load {what} from {path!r}: {reason}")

    problem = model_folder_problem(path)
    if problem:
        refuse(problem)
    adapter = Path(path).expanduser() / "adapter_config.json"
    task = {transformers.AutoModelForCausalLM: "CAUSAL_LM", transformers.AutoModelForSequenceClassification: "SEQ_CLS"}
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # its load report: what is checked here and below, said in one line
    try:
        if adapter.is_file():
            adapter_task = json.loads(adapter.read_text()).get("task_type")
            if adapter_task != task[auto_class]:
                refuse(f"it is a LoRA adapter for {adapter_task} (its task_type), not for {task[auto_class]}")
            import peft

            peft_class = getattr(peft, auto_class.__name__.replace("AutoModel", "AutoPeftModel"))
            model = peft_class.from_pretrained(path, **kwargs).merge_and_unload()
            return model.requires_grad_(True), []  # as from_pretrained's: peft froze the base model's weights
        model, info = auto_class.from_pretrained(path, output_loading_info=True, ignore_mismatched_sizes=True, **kwargs)
    except (OSError, ValueError, RuntimeError) as error:
        refuse(first_line(error))
    finally:
        transformers.logging.set_verbosity(verbosity)
    for key, saved, expected in sorted(info["mismatched_keys"]):
        labels = (
            f": a classifier with {saved[0]} labels, where {what} has {expected[0]}" if key == "score.weight" else ""
        )
        refuse(f"{key} is {tuple(saved)} in the checkpoint, not {tuple(expected)}{labels}")
    return model, sorted(info["missing_keys"])


def load_sequence_classifier(path: str, flag: str, what: str = "a reward model", new_head: bool = False, **kwargs):
    """A sequence-classification model with one label (num_labels=1) from `path` (`load_pretrained`) and the names of
    the weights that were not in the checkpoint. Its score head must come from the checkpoint (a reward model), unless
    `new_head`: then a causal LM gets a new one (reward_model.py; ppo.py's value model)."""
    from transformers import AutoModelForSequenceClassification

    model, missing = load_pretrained(AutoModelForSequenceClassification, path, flag, what, num_labels=1, **kwargs)
    if not new_head and any(key.startswith("score.") for key in missing):
        kind = (model.config.architectures or ["a model without a score head"])[0]
        raise ConfigError(
            f"{flag}: {path} is {kind}, not {what}: it has no trained score head (one would start random); train a "
            "reward model with reward_model.py"
        )
    return model, missing


def reward_model_function(path: str, device, batch_size: int = 32, prepare=None):
    """Score (prompt, completion) pairs with a sequence-classification reward model (num_labels=1), whose score head
    and every other weight come from the checkpoint (a LoRA reward model is merged into its base).

    Conversational samples go through the reward model's own chat template, prompt and answer together. `prepare`
    readies the loaded model for scoring and returns what to call (default: eval mode, no gradients, on `device`); the
    scripts pass `common.prepare_frozen`, which wraps it in an inference engine under DeepSpeed ZeRO-3.
    """
    from transformers import AutoTokenizer

    flag = "--reward_model_path"
    model, missing = load_sequence_classifier(path, flag)
    if missing:
        raise ConfigError(
            f"{flag}: {len(missing)} weights of {path} are not in the checkpoint: {', '.join(missing[:3])}"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as error:
        raise ConfigError(f"{flag}: cannot load a tokenizer from {path!r}: {first_line(error)}") from None
    if tokenizer.pad_token is None and tokenizer.eos_token is None:
        raise ConfigError(f"{flag}: the tokenizer of {path} has neither a pad nor an eos token to pad batches with")
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


def load_reward_funcs(
    reward_funcs: str | list[str],
    reward_model_path: str | None = None,
    device="cpu",
    prepare=None,
    max_completion_length: int | None = None,
) -> dict:
    """{name: function} from --reward_funcs (built-in names, module:function, path/to/file.py:function or a dotted
    path; 'none' for no function) plus the reward model of --reward_model_path, if any (`prepare`: see
    reward_model_function). TRL's get_soft_overlong_punishment is built for the run's `max_completion_length`, its
    last fifth penalized (TRL fixes 1280 tokens and the last 256)."""
    functions = {}
    for spec in split_list(reward_funcs):
        if spec == "none":
            continue
        if spec in BUILTIN_REWARDS:
            function = BUILTIN_REWARDS[spec]
        elif spec == "get_soft_overlong_punishment" and max_completion_length:
            function = get_soft_overlong_punishment(max_completion_length, max_completion_length // 5)
        elif ":" in spec or "." in spec:
            function = import_function(spec)
        else:
            raise ConfigError(
                f"--reward_funcs: unknown reward function {spec!r} (built-in: {', '.join(BUILTIN_REWARDS)}, "
                "get_soft_overlong_punishment; or module:function, path/to/file.py:function, package.module.function)"
            )
        name = getattr(function, "__name__", spec.rpartition(":")[2])  # a functools.partial has no name
        if name in functions:
            raise ConfigError(f"--reward_funcs: two reward functions are named {name} (their metrics would mix)")
        functions[name] = function
    if reward_model_path:
        function = reward_model_function(reward_model_path, device, prepare=prepare)
        functions[function.__name__] = function
    if not functions:
        raise ConfigError("--reward_funcs: no reward function selected (and no --reward_model_path)")
    return functions


def reward_weights(weights: str | list[str], reward_funcs: dict) -> torch.Tensor:
    """--reward_weights as a tensor; empty means 1.0 for every function."""
    try:
        values = split_list(weights, float) or [1.0] * len(reward_funcs)
    except ValueError:
        given = weights if isinstance(weights, str) else " ".join(weights)
        raise ConfigError(f"--reward_weights: expected comma-separated numbers, got {given!r}") from None
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
    prompts, completions and completion_ids: TRL's `accuracy_reward(completions, solution, **kwargs)` needs solution."""
    parameters = inspect.signature(function).parameters.values()
    return [
        p.name
        for p in parameters
        if p.default is p.empty and p.name not in TRL_ARGUMENTS and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]


def check_columns(reward_funcs: dict, dataset, flag: str = "--dataset_name"):
    """Every column each reward function needs is in the dataset (one of its `one_of_columns` too, where it has that
    attribute, as accuracy_reward does), and it accepts every keyword it will be called with (TRL's arguments and
    every dataset column, which `**kwargs` takes): checked before training, not at its first step."""
    keywords = [*TRL_ARGUMENTS, *(c for c in dataset.column_names if c != "prompt")]
    for name, function in reward_funcs.items():
        one_of = getattr(function, "one_of_columns", ())
        if one_of and not set(one_of) & set(dataset.column_names):
            raise ConfigError(
                f"{flag}: the dataset has no {' or '.join(map(repr, one_of))} column, one of which reward function "
                f"{name} needs (columns: {dataset.column_names})"
            )
        used = [c for c in one_of if c in dataset.column_names][:1]  # the first one present is the one read
        for column in [*required_columns(function), *used]:
            if column not in dataset.column_names:
                raise ConfigError(
                    f"{flag}: the dataset has no {column!r} column, which reward function {name} needs "
                    f"(columns: {dataset.column_names})"
                )
            empty = sum(value is None for value in dataset[column])
            if empty:
                print(
                    f"{flag}: {empty} of {len(dataset)} rows have no {column!r} (None), which reward function {name} "
                    "needs: it gets None for them"
                )
        parameters = inspect.signature(function).parameters
        if not any(p.kind == p.VAR_KEYWORD for p in parameters.values()):
            refused = [
                k for k in keywords if k not in parameters or parameters[k].kind == inspect.Parameter.POSITIONAL_ONLY
            ]
            if refused:
                raise ConfigError(
                    f"--reward_funcs: reward function {name} does not take the keyword {refused[0]!r}: give it "
                    "**kwargs, as TRL's reward functions have (it is called with prompts, completions, completion_ids "
                    "and every dataset column)"
                )


def reward_values(name: str, values, num_completions: int) -> torch.Tensor:
    """What reward function `name` returned (or raised), as one float per completion, NaN for None. It may return any
    sequence or iterable of numbers, a 1-D numpy array or tensor; a number is a Python, numpy or torch scalar, or a
    bool (TRL takes all of these). Anything else is a TrainingError naming the function."""
    if isinstance(values, BaseException):
        raise TrainingError(f"reward function {name}: raised {type(values).__name__}: {first_line(values)}")
    values = values.tolist() if hasattr(values, "tolist") else values  # a numpy array or tensor (a scalar stays one)
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
        raise TrainingError(f"reward function {name}: returned {values!r}, not a list with one value per completion")
    values = list(values)
    if len(values) != num_completions:
        raise TrainingError(f"reward function {name}: returned {len(values)} values for {num_completions} completions")
    numbers = []
    for i, value in enumerate(values):
        try:
            number = math.nan if value is None else float(value)  # numpy and torch scalars convert, strings do not
        except (TypeError, ValueError):
            number = None
        if isinstance(value, (str, bytes)) or number is None or (value is not None and not math.isfinite(number)):
            raise TrainingError(
                f"reward function {name}: returned {value!r} for completion {i} (expected a finite number or None)"
            )
        numbers.append(number)
    return torch.tensor(numbers)


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

    Sync functions run in order; `async` ones (whatever returns an awaitable) are awaited concurrently. A function
    that raises, or returns anything but one finite number or None per completion, stops the run (a TrainingError
    naming it, on every process alike: the script saves a checkpoint first). A conversation that ends with the
    assistant's turn reaches the functions continued (`reward_inputs`).
    """
    prompts, completions = map(list, zip(*(reward_inputs(p, t) for p, t in zip(prompts, completion_texts))))
    kwargs = dict(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)
    results = {}
    for name, function in reward_funcs.items():
        try:
            results[name] = function(**kwargs)  # an `async` function returns its coroutine, to be awaited below
        except Exception as error:  # the user's code: kept, to be reported with the function's name
            results[name] = error
    pending = [name for name, result in results.items() if inspect.isawaitable(result)]
    if pending:

        async def run_all():
            return await asyncio.gather(*(results[name] for name in pending), return_exceptions=True)

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
