"""Reward helpers: extract_answer / accuracy_reward / format_reward, and how rewards combine."""

import math
import time

import pytest
import torch

from common import ConfigError
from rewards import (
    accuracy_reward,
    compute_rewards,
    extract_answer,
    format_reward,
    load_reward_funcs,
    reward_model_function,
    reward_weights,
)


def test_extract_answer():
    assert extract_answer("so <answer> 84 </answer>") == "84"
    assert extract_answer("<answer>\n-3\n</answer> trailing") == "-3"
    assert extract_answer("no tags here") is None


def test_accuracy_reward_compares_the_extracted_answer():
    completions = [
        "<answer>84</answer>",
        "<answer>85</answer>",
        "84",
        [{"role": "assistant", "content": "<answer>7</answer>"}],
    ]
    assert accuracy_reward(completions, ground_truth=["84", "84", "84", 7]) == [1.0, 0.0, 0.0, 1.0]


def test_format_reward_requires_a_numeric_answer_at_the_end():
    completions = [
        "<answer>84</answer>",
        "think... <answer>-1.5</answer>\n",
        "<answer>cat</answer>",
        "<answer>3</answer> more",
        "84",
    ]
    assert format_reward(completions) == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_seed_weighting_example():
    """Seed 000 §23: correct and well-formed gives 1×1.0 + 1×0.2 = 1.2; only well-formed gives 0.2."""
    funcs = load_reward_funcs("accuracy,format")
    weights = reward_weights("1.0,0.2", funcs)
    rewards, per_func = compute_rewards(
        funcs,
        weights,
        ["q", "q"],
        ["<answer>84</answer>", "<answer>83</answer>"],
        [[1], [1]],
        {"ground_truth": ["84", "84"]},
    )
    assert rewards.tolist() == pytest.approx([1.2, 0.2])
    assert per_func.tolist() == [[1.0, 1.0], [0.0, 1.0]]


def test_none_means_not_applicable_and_is_skipped():
    def only_even(completions, **kwargs):
        return [1.0 if i % 2 == 0 else None for i in range(len(completions))]

    rewards, per_func = compute_rewards(
        {"only_even": only_even, "format_reward": format_reward},
        torch.tensor([2.0, 1.0]),
        ["a", "b"],
        ["<answer>1</answer>", "x"],
        [[], []],
        {},
    )
    assert math.isnan(per_func[1, 0])
    assert rewards.tolist() == [3.0, 0.0]


def test_extra_columns_and_completion_ids_reach_reward_functions():
    seen = {}

    def spy(prompts, completions, completion_ids, difficulty, **kwargs):
        seen.update(prompts=prompts, completions=completions, completion_ids=completion_ids, difficulty=difficulty)
        return [0.0] * len(prompts)

    conversational = [{"role": "user", "content": "hi"}]
    compute_rewards({"spy": spy}, torch.ones(1), [conversational], ["hello"], [[5, 6]], {"difficulty": ["hard"]})
    assert seen["completions"] == [[{"role": "assistant", "content": "hello"}]]
    assert seen["completion_ids"] == [[5, 6]] and seen["difficulty"] == ["hard"]


def test_async_reward_functions_are_awaited_concurrently():
    import asyncio

    async def slow_a(completions, **kwargs):
        await asyncio.sleep(0.3)
        return [1.0] * len(completions)

    async def slow_b(completions, **kwargs):
        await asyncio.sleep(0.3)
        return [2.0] * len(completions)

    start = time.perf_counter()
    rewards, _ = compute_rewards({"slow_a": slow_a, "slow_b": slow_b}, torch.ones(2), ["p"], ["c"], [[]], {})
    assert time.perf_counter() - start < 0.55  # two 0.3 s functions, overlapped
    assert rewards.tolist() == [3.0]


def test_wrong_length_and_nan_are_errors_naming_the_function():
    def short(completions, **kwargs):
        return [1.0]

    def nan(completions, **kwargs):
        return [float("nan")] * len(completions)

    with pytest.raises(ConfigError, match="reward function short: returned 1 values for 2 completions"):
        compute_rewards({"short": short}, torch.ones(1), ["a", "b"], ["x", "y"], [[], []], {})
    with pytest.raises(ConfigError, match="reward function nan: returned nan"):
        compute_rewards({"nan": nan}, torch.ones(1), ["a"], ["x"], [[]], {})


def test_load_reward_funcs_by_name_module_and_file(tmp_path):
    assert list(load_reward_funcs("accuracy, format")) == ["accuracy_reward", "format_reward"]
    assert list(load_reward_funcs("rewards:format_reward")) == ["format_reward"]
    path = tmp_path / "my_rewards.py"
    path.write_text("def length_reward(completions, **kwargs):\n    return [float(len(c)) for c in completions]\n")
    funcs = load_reward_funcs(f"{path}:length_reward")
    assert funcs["length_reward"](completions=["abc"]) == [3.0]
    with pytest.raises(ConfigError, match="--reward_funcs: unknown reward function 'acuracy'"):
        load_reward_funcs("acuracy")
    with pytest.raises(ConfigError, match="--reward_funcs: cannot import"):
        load_reward_funcs("no_such_module:f")
    with pytest.raises(ConfigError, match="--reward_weights: 1 weights for 2"):
        reward_weights("1.0", load_reward_funcs("accuracy,format"))


def test_reward_model_scores_prompt_and_completion(tmp_path, tiny_tokenizer):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    import common

    config = AutoConfig.from_pretrained(common.EMBEDDED_MODEL, num_labels=1)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(tmp_path / "rm")
    tiny_tokenizer.save_pretrained(tmp_path / "rm")
    score = reward_model_function(str(tmp_path / "rm"), "cpu")
    assert score.__name__ == "rm"
    prompt = [{"role": "user", "content": "Compute 1 + 1."}]
    values = score(
        prompts=[prompt, prompt, "plain"],
        completions=[
            [{"role": "assistant", "content": "<answer>2</answer>"}],
            [{"role": "assistant", "content": "<answer>3</answer>"}],
            " text",
        ],
    )
    assert len(values) == 3 and all(math.isfinite(v) for v in values) and values[0] != values[1]
    # batching and padding do not change a score
    alone = score(prompts=[prompt], completions=[[{"role": "assistant", "content": "<answer>3</answer>"}]])
    assert alone[0] == pytest.approx(values[1], abs=1e-5)
    with pytest.raises(ConfigError, match="--reward_model_path"):
        reward_model_function(str(tmp_path / "missing"), "cpu")
