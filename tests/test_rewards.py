"""rewards.py: TRL's reward functions and conventions, a user's functions, reward models, and the weighted sum."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rewards import (
    RewardError,
    accuracy_reward,
    check_columns,
    compute_rewards,
    extract_answer,
    format_reward,
    load_reward_funcs,
    reasoning_accuracy_reward,
    reward_model_function,
    reward_weights,
    think_format_reward,
)


def said(text: str) -> list:
    return [{"role": "assistant", "content": text}]


def funcs(specs: str, max_completion_length: int = 24, reward_model_path=None) -> dict:
    args = SimpleNamespace(
        reward_funcs=[specs],
        reward_model_path=reward_model_path,
        max_completion_length=max_completion_length,
    )
    return load_reward_funcs(args)


def test_extract_answer_and_the_arithmetic_check():
    assert extract_answer("so <answer> 84 </answer>") == "84"
    assert extract_answer("no tags") is None
    completions = [
        "<answer>84</answer>",
        "<answer>84.0</answer>",
        r"\boxed{84}",
        "<answer>85</answer>",
    ]
    assert accuracy_reward(completions, ground_truth=["84", 84, "84", None]) == [
        1.0,
        1.0,
        0.0,
        None,
    ]
    assert accuracy_reward([said("<answer>7</answer>")], ground_truth=["7"]) == [1.0]


def test_accuracy_reward_verifies_the_boxed_answer_against_a_latex_solution():
    """TRL's accuracy_reward: math-verify compares the answers as math; None where the solution does not parse."""
    completions = [
        r"The answer is \boxed{42}.",
        r"\boxed{0.5}",
        r"\boxed{41}",
        "42",
        r"\boxed{42}",
    ]
    solutions = ["$42$", r"\frac{1}{2}", "42", "42", "no number here"]
    assert accuracy_reward([said(c) for c in completions], solutions) == [1.0, 1.0, 0.0, 0.0, None]
    # TRL's example
    trl = [said(r"My answer is \boxed{\frac{1}{3}}"), said(r"My answer is \boxed{\frac{1}{2}}")]
    assert accuracy_reward(trl, [r"\frac{1}{3}"] * 2) == [1.0, 0.0]
    # our addition: an <answer> tag is verified where there is no \boxed{}
    assert accuracy_reward(
        ["<answer>7</answer>", r"\boxed{7} <answer>8</answer>"], ["$7$", "7"]
    ) == [1.0, 1.0]


def test_trls_other_built_in_rewards_give_its_documented_values():
    thought = [
        said(r"<think> Reasoning content </think> The final answer is \boxed{\frac{1}{3}}"),
        said(r"<think> Reasoning content </think> The final answer is \boxed{\frac{1}{2}}"),
        said(
            r"<think> Reasoning content with partial answers \boxed{\frac{1}{3}} but no final answer"
        ),
    ]
    assert reasoning_accuracy_reward(thought, solution=[r"\frac{1}{3}"] * 3) == [1.0, 0.0, 0.0]
    formats = [
        said("<think>\nThis is my reasoning.\n</think>\nThis is my answer."),
        said("<think>\nNo end."),
    ]
    assert think_format_reward(formats) == [1.0, 0.0]
    assert format_reward(
        ["<answer>84</answer>", "x <answer>-1.5</answer>\n", "<answer>a</answer>", "84"]
    ) == [
        1.0,
        1.0,
        0.0,
        0.0,
    ]
    # built for the run's --max_completion_length, its last fifth penalized: 90 of 100 tokens is halfway down to −1
    (overlong,) = funcs("get_soft_overlong_punishment", max_completion_length=100).values()
    assert overlong(completion_ids=[[1] * 80, [1] * 90, [1] * 100]) == [0.0, -0.5, -1.0]


def test_the_weighted_sum_skips_none_and_an_unscorable_completion_is_nan():
    """1 × accuracy + 0.2 × format: right and well-formed is 1.2; only well-formed 0.2. None does not apply."""
    functions = funcs("accuracy,format")
    weights = reward_weights(["1.0", "0.2"], functions)
    completions = ["<answer>84</answer>", "<answer>83</answer>", "84"]
    rewards, per_func = compute_rewards(
        functions, weights, ["q"] * 3, completions, [[1]] * 3, {"ground_truth": ["84", "84", None]}
    )
    assert rewards.tolist() == pytest.approx([1.2, 0.2, 0.0])
    assert math.isnan(per_func[2, 0])
    nothing = lambda completions, **kwargs: [None] * len(completions)
    rewards, _ = compute_rewards({"nothing": nothing}, torch.ones(1), ["q"], ["x"], [[1]], {})
    assert math.isnan(rewards[0])  # unscorable: left out of baselines and statistics, not 0


def test_columns_completion_ids_and_trls_completion_format_reach_the_functions():
    seen = {}

    def spy(prompts, completions, completion_ids, difficulty, **kwargs):
        seen.update(
            prompts=prompts,
            completions=completions,
            completion_ids=completion_ids,
            difficulty=difficulty,
        )
        return np.zeros(len(prompts))  # a numpy array, as TRL takes

    prefilled = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<answer>"}]
    compute_rewards(
        {"spy": spy},
        torch.ones(1),
        [prefilled],
        ["7</answer>"],
        [[5, 6]],
        {"difficulty": ["hard"]},
    )
    assert seen["prompts"] == [prefilled[:1]]  # the continued turn is the completion's start
    assert seen["completions"] == [said("<answer>7</answer>")]
    assert seen["completion_ids"] == [[5, 6]]
    assert seen["difficulty"] == ["hard"]


def test_a_function_returning_the_wrong_count_or_non_numbers_is_one_error_naming_it():
    short = lambda completions, **kwargs: [1.0]
    with pytest.raises(
        RewardError, match="reward function short returned 1 values for 2 completions"
    ):
        compute_rewards({"short": short}, torch.ones(1), ["a", "b"], ["x", "y"], [[], []], {})
    words = lambda completions, **kwargs: ["good"] * len(completions)
    with pytest.raises(RewardError, match="reward function words returned"):
        compute_rewards({"words": words}, torch.ones(1), ["a"], ["x"], [[]], {})
    mixed = lambda completions, **kwargs: [None, "good"]  # a word after a None is caught too
    with pytest.raises(RewardError, match="reward function mixed returned"):
        compute_rewards({"mixed": mixed}, torch.ones(1), ["a", "b"], ["x", "y"], [[], []], {})
    infinite = lambda completions, **kwargs: [float("inf")] * len(completions)
    with pytest.raises(
        RewardError, match="reward function infinite returned .*expected finite numbers or None"
    ):
        compute_rewards({"infinite": infinite}, torch.ones(1), ["a"], ["x"], [[]], {})


def test_functions_by_name_file_and_dotted_path_and_their_errors(tmp_path, monkeypatch):
    assert list(funcs("accuracy, format")) == ["accuracy_reward", "format_reward"]
    assert list(funcs("rewards.format_reward")) == ["format_reward"]  # TRL's dotted form
    path = tmp_path / "my_rewards.py"
    path.write_text(
        "def length_reward(completions, **kwargs):\n    return [float(len(c)) for c in completions]\n"
    )
    assert funcs(f"{path}:length_reward")["length_reward"](completions=["abc"]) == [3.0]
    monkeypatch.chdir(tmp_path)
    # a module in the current folder
    assert list(funcs("my_rewards:length_reward")) == ["length_reward"]
    for spec, message in [
        ("acuracy", "unknown reward function 'acuracy'"),
        ("no_such_module:f", "cannot import 'no_such_module:f'"),
        ("my_rewards:missing", "has no function 'missing'"),
        ("none", "no reward function"),
    ]:
        with pytest.raises(RewardError, match=message):
            funcs(spec)
    with pytest.raises(RewardError, match="--reward_weights: 1 weights for 2"):
        reward_weights(["1.0"], funcs("accuracy,format"))


def test_a_missing_column_is_said_before_training():
    from datasets import Dataset

    with pytest.raises(
        RewardError, match="accuracy_reward needs a column solution or ground_truth"
    ):
        check_columns(funcs("accuracy"), Dataset.from_list([{"prompt": "p"}]), "train")
    needs = lambda completions, difficulty, **kwargs: [0.0] * len(completions)
    with pytest.raises(RewardError, match="missing a required argument: 'difficulty'"):
        check_columns({"needs": needs}, Dataset.from_list([{"prompt": "p"}]), "train")
    check_columns(funcs("accuracy"), None, "test")  # no such split: nothing to check


def test_a_reward_model_scores_text_through_its_own_tokenizer(tmp_path, tiny_tokenizer):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from conftest import EMBEDDED

    config = AutoConfig.from_pretrained(
        EMBEDDED, num_labels=1, pad_token_id=tiny_tokenizer.pad_token_id
    )
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(tmp_path / "rm")
    tiny_tokenizer.save_pretrained(tmp_path / "rm")
    score = reward_model_function(str(tmp_path / "rm"), "cpu")
    assert score.__name__ == "rm"
    scores = score(prompts=["a", "b"], completions=["<answer>1</answer>", "<answer>2</answer>"])
    assert len(scores) == 2
    assert scores[0] != scores[1]
    conversational = score(
        prompts=[[{"role": "user", "content": "a"}]], completions=[said("<answer>1</answer>")]
    )
    assert len(conversational) == 1
    AutoModelForSequenceClassification.from_config(
        AutoConfig.from_pretrained(EMBEDDED, num_labels=2)
    ).save_pretrained(tmp_path / "two")
    tiny_tokenizer.save_pretrained(tmp_path / "two")
    with pytest.raises(RewardError, match="has 2 labels; a reward model has one"):
        reward_model_function(str(tmp_path / "two"), "cpu")


def test_a_reward_model_whose_pad_token_is_its_end_token_scores_a_text_alike_alone_and_in_a_batch(
    tmp_path,
):
    """SmolLM2-135M-Instruct pads with its end token, <|im_end|>: the score must still be read at the text's end."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from conftest import EMBEDDED

    tokenizer = AutoTokenizer.from_pretrained(EMBEDDED)
    tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForSequenceClassification.from_pretrained(EMBEDDED, num_labels=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    score = reward_model_function(str(tmp_path), "cpu")
    prompt = [{"role": "user", "content": "Compute 7 × 8. Answer in the form <answer>N</answer>."}]
    short = [{"role": "assistant", "content": "<answer>56</answer>"}]
    long = [
        {"role": "assistant", "content": "7 × 8 = 56, since 7 × 8 = 7 × 4 × 2 <answer>56</answer>"}
    ]
    alone = score(prompts=[prompt], completions=[short])
    batch = score(prompts=[prompt, prompt], completions=[short, long])
    assert batch[0] == pytest.approx(alone[0], abs=1e-5)
    assert batch[1] != pytest.approx(batch[0], abs=1e-5)
