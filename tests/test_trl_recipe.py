"""A TRL user's recipe runs unchanged: TRL's reward functions and names, its list syntax for --reward_funcs and
--reward_weights (our comma form too), a math dataset laid out as trl-lib/DeepMath-103K (a conversational prompt, a
LaTeX solution, parquet files in the hub's layout) trained on by rloo.py and grpo.py, and an evaluation of its test
split with the run's own reward functions."""

import types

import pytest
import torch
from datasets import Dataset
from test_faults import cli_error

import common
import grpo
import ppo
import reinforce
import rloo
from hub_like import make_deepmath_like_dataset
from rewards import (
    ConfigError,
    accuracy_reward,
    load_reward_funcs,
    reasoning_accuracy_reward,
    reward_weights,
    think_format_reward,
)

RL = {"rloo.py": rloo, "grpo.py": grpo, "reinforce.py": reinforce, "ppo.py": ppo}
TINY = {  # a few steps on the DeepMath-like fixture (64 training prompts, 16 held out)
    "rloo.py": ["--prompts_per_step", "4", "--num_generations", "2"],
    "grpo.py": ["--prompts_per_step", "4", "--num_generations", "4"],
}
QUICK = ["--max_steps", "2", "--logging_steps", "1", "--eval_steps", "0", "--save_steps", "0"]


@pytest.fixture(scope="module")
def deepmath(tmp_path_factory) -> str:
    return str(make_deepmath_like_dataset(tmp_path_factory.mktemp("deepmath") / "DeepMath-103K"))


def said(text: str) -> list:
    return [{"role": "assistant", "content": text}]


# ---- 1. TRL's reward functions
# ----------------------------------------------------------------------------------------------------------------------
def test_accuracy_reward_verifies_the_boxed_answer_against_a_latex_solution():
    completions = [
        r"The answer is \boxed{42}.",
        r"\boxed{0.5}",  # equal as math, not as text
        r"so \boxed{\frac{2}{4}}",
        r"\boxed{41}",
        "42",  # no \boxed{} and no LaTeX: nothing to verify, as in TRL
        r"\boxed{42}",
    ]
    solutions = ["$42$", r"\frac{1}{2}", r"$\frac{1}{2}$", "42", "42", "no number here"]
    assert accuracy_reward([said(c) for c in completions], solutions) == [1.0, 1.0, 1.0, 0.0, 0.0, None]
    # TRL's own example (its docstring)
    trl = [said(r"My answer is \boxed{\frac{1}{3}}"), said(r"My answer is \boxed{\frac{1}{2}}")]
    assert accuracy_reward(trl, [r"\frac{1}{3}"] * 2) == [1.0, 0.0]


def test_accuracy_reward_reads_an_answer_tag_where_there_is_no_boxed_answer():
    """Our addition to TRL's: the arithmetic task's <answer>N</answer> (what the embedded model writes) is verified too;
    a \\boxed{} answer comes first."""
    completions = ["7 ÷ 1 = 7 <answer>7</answer>", "<answer>8</answer>", r"\boxed{7} <answer>8</answer>"]
    assert accuracy_reward(completions, solution=["$7$", r"\frac{14}{2}", "7"]) == [1.0, 0.0, 1.0]


def test_the_arithmetic_task_keeps_its_ground_truth_check():
    completions = ["<answer>84</answer>", "<answer>84.0</answer>", r"\boxed{84}", "<answer>85</answer>"]
    assert accuracy_reward(completions, ground_truth=["84", 84, "84", None]) == [1.0, 1.0, 0.0, None]


def test_trls_other_built_in_rewards_give_its_documented_values():
    thought = [
        said(r"<think> Reasoning content </think> The final answer is \boxed{\frac{1}{3}}"),
        said(r"<think> Reasoning content </think> The final answer is \boxed{\frac{1}{2}}"),
        said(r"<think> Reasoning content with partial answers \boxed{\frac{1}{3}} but no final answer"),
    ]
    assert reasoning_accuracy_reward(thought, solution=[r"\frac{1}{3}"] * 3) == [1.0, 0.0, 0.0]
    formats = [said("<think>\nThis is my reasoning.\n</think>\nThis is my answer."), said("<think>\nNo end.")]
    assert think_format_reward(formats) == [1.0, 0.0]
    # built for the run's --max_completion_length, its last fifth penalized: 90 of 100 tokens is halfway down to -1
    (overlong,) = load_reward_funcs("get_soft_overlong_punishment", max_completion_length=100).values()
    assert overlong(completion_ids=[[1] * 80, [1] * 90, [1] * 100]) == [0.0, -0.5, -1.0]


def test_reward_functions_by_trl_name_our_name_module_file_and_dotted_path(tmp_path, monkeypatch):
    names = ["accuracy_reward", "think_format_reward", "reasoning_accuracy_reward"]
    assert list(load_reward_funcs(names)) == names
    assert load_reward_funcs("accuracy")["accuracy_reward"] is accuracy_reward
    assert list(load_reward_funcs("rewards.format_reward")) == ["format_reward"]  # TRL's dotted path
    # a package in the folder the script is run from, as TRL's scripts import it
    (tmp_path / "recipe_rewards").mkdir()
    (tmp_path / "recipe_rewards" / "__init__.py").write_text("")
    (tmp_path / "recipe_rewards" / "lengths.py").write_text(
        "def length_reward(completions, **kwargs):\n    return [float(len(c)) for c in completions]\n"
    )
    monkeypatch.chdir(tmp_path)
    funcs = load_reward_funcs("recipe_rewards.lengths.length_reward")
    assert funcs["length_reward"](completions=["abc"]) == [3.0]
    assert list(load_reward_funcs("recipe_rewards.lengths:length_reward")) == ["length_reward"]
    with pytest.raises(ConfigError, match="--reward_funcs: cannot import 'recipe_rewards.nothing.f'"):
        load_reward_funcs("recipe_rewards.nothing.f")


# ---- the flags: TRL's lists and our commas
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("script", RL)
@pytest.mark.parametrize(
    "flags",
    [
        ["--reward_funcs", "accuracy_reward", "format", "--reward_weights", "1.0", "0.2"],  # TRL's
        ["--reward_funcs", "accuracy,format", "--reward_weights", "1.0,0.2"],  # ours
        ["--reward_funcs", "accuracy_reward", "format", "--reward_weights", "1.0,0.2"],
    ],
    ids=["lists", "commas", "both"],
)
def test_reward_funcs_and_weights_take_a_list_or_commas(script, flags):
    args = common.parse_args(RL[script].Args, flags)
    funcs = load_reward_funcs(args.reward_funcs)
    assert list(funcs) == ["accuracy_reward", "format_reward"]
    assert reward_weights(args.reward_weights, funcs).tolist() == pytest.approx([1.0, 0.2])


def test_a_resumed_run_may_give_a_list_flag_in_either_form():
    assert common.same_setting(["accuracy", "format"], ["accuracy,format"])
    assert not common.same_setting(["accuracy", "format"], ["accuracy"])


@pytest.mark.parametrize("script", ["rloo.py", pytest.param("grpo.py", marks=pytest.mark.slow)])
def test_an_unknown_reward_name_is_one_line(tmp_path, capsys, script):
    argv = ["--reward_funcs", "accuracy_reward", "format_rewards", "--output_dir", str(tmp_path / "out")]
    line = cli_error(script, argv, capsys)
    assert line.startswith("error: --reward_funcs: unknown reward function 'format_rewards' (built-in: accuracy, ")
    assert not (tmp_path / "out").exists()


def rename_solution(folder, name: str):
    for file in (folder / "data").glob("*.parquet"):
        Dataset.from_parquet(str(file)).rename_column("solution", name).to_parquet(file)


def test_a_dataset_without_an_answer_column_is_one_line_naming_both(tmp_path, capsys):
    folder = make_deepmath_like_dataset(tmp_path / "answers")
    rename_solution(folder, "answer")  # gsm8k's name
    line = cli_error("rloo.py", ["--dataset_name", str(folder), "--output_dir", str(tmp_path / "out")], capsys)
    assert line == (
        "error: --dataset_name: the dataset has no 'solution' or 'ground_truth' column, one of which reward function "
        "accuracy_reward needs (columns: ['prompt', 'answer'])"
    )


def test_two_local_folders_of_one_name_are_each_read(tmp_path):
    """datasets keys the cache of a folder with a dataset card on the folder's name: it is read afresh each time."""
    first, second = (make_deepmath_like_dataset(tmp_path / str(i) / "DeepMath-103K") for i in (1, 2))
    rename_solution(second, "ground_truth")
    assert common.load_split(str(first), "test").column_names == ["prompt", "solution"]
    assert common.load_split(str(second), "test").column_names == ["prompt", "ground_truth"]


# ---- 2. evaluation with the run's own rewards
# ----------------------------------------------------------------------------------------------------------------------
EVAL = types.SimpleNamespace(
    temperature=1.0,
    top_p=1.0,
    top_k=0,
    max_completion_length=12,
    num_generations_eval=2,
    per_device_eval_batch_size=64,
    chat_template_kwargs=None,
)


def test_evaluation_scores_with_the_runs_rewards_and_their_weights(deepmath, tiny_model, tiny_tokenizer):
    """eval/reward is the weighted sum training maximizes; each function is logged under its name less `_reward`, and
    accuracy on the solution column even when no reward function of the run checks it (weight 0)."""
    test = common.load_split(deepmath, "test")
    funcs = load_reward_funcs(["format", "get_soft_overlong_punishment"], max_completion_length=10)
    metrics = common.evaluate(tiny_model, tiny_tokenizer, test, EVAL, funcs, seed=0, weights=torch.tensor([0.5, 1.0]))
    names = ["reward", "format", "soft_overlong_punishment", "accuracy"]
    assert set(metrics) == {f"eval/{name}{suffix}" for name in names for suffix in ("", "_greedy")}
    for suffix in ("", "_greedy"):
        weighted = 0.5 * metrics[f"eval/format{suffix}"] + metrics[f"eval/soft_overlong_punishment{suffix}"]
        assert metrics[f"eval/reward{suffix}"] == pytest.approx(weighted, abs=1e-6)
    assert metrics["eval/accuracy_greedy"] > 0 and metrics["eval/soft_overlong_punishment"] < 0  # ids reach it
    # a test split without an answer column is evaluated too, with the run's functions only
    metrics = common.evaluate(tiny_model, tiny_tokenizer, test.remove_columns("solution"), EVAL, funcs, seed=0)
    assert set(metrics) == {f"eval/{name}{suffix}" for name in names[:3] for suffix in ("", "_greedy")}


def test_a_reward_function_that_raises_in_the_evaluation_is_one_line(tmp_path, capsys):
    module = tmp_path / "picky.py"
    module.write_text("def picky(completions, solution, **kwargs):\n    raise ValueError('no ' + solution[0])\n")
    folder = make_deepmath_like_dataset(tmp_path / "data")
    argv = ["--dataset_name", str(folder), "--reward_funcs", f"{module}:picky", "--output_dir", str(tmp_path / "out")]
    line = cli_error("rloo.py", [*TINY["rloo.py"], *QUICK, *argv], capsys)
    assert line == "error: held-out evaluation: reward function picky: raised ValueError: no $2$"


# ---- 7. the hub recipe, on a local copy of DeepMath-103K's layout
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "script, reward_flags",
    [
        ("rloo.py", ["--reward_funcs", "accuracy_reward"]),  # TRL's quick start
        pytest.param(
            "grpo.py",
            ["--reward_funcs", "accuracy,format", "--reward_weights", "1.0,0.2"],
            marks=pytest.mark.slow,
        ),
    ],
)
def test_the_hub_recipe_trains_and_evaluates_on_a_deepmath_layout(tmp_path, capsys, deepmath, script, reward_flags):
    out = tmp_path / "out"
    argv = [*TINY[script], *QUICK, "--num_generations_eval", "2", "--dataset_name", deepmath, *reward_flags]
    common.cli(RL[script].main, RL[script].Args, [*argv, "--output_dir", str(out)])
    records = common.read_metrics(out)
    training = [r for r in records if "reward" in r]
    evals = [r for r in records if "eval/reward" in r]
    assert [r["step"] for r in training] == [1, 2] and [r["step"] for r in evals] == [0, 2]
    assert max(r["rewards/accuracy_reward/mean"] for r in training) > 0  # right boxed-or-tagged answers score
    assert all(r["eval/accuracy"] > 0 and r["eval/accuracy_greedy"] > 0 for r in evals)
    assert "held-out accuracy (sampled, T=1.0): " in capsys.readouterr().out
