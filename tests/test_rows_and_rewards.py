"""Rows that cannot be trained on, and reward functions at the edges (issue 20, causes 2 and 5), in every script they
reach.

Rows: every text column a script reads (prompt; sft's completion; reward_model's chosen and rejected, with or without
a prompt) is checked as it loads, from every file format. A row that means nothing stops the run with one line naming
the column, the split and the row; a row with nothing to train on is skipped, and one line says how many. A prompt
that ends with the assistant's turn is continued, as TRL continues it.

Reward functions: whatever a reasonable one returns (numpy or torch numbers, arrays, tensors, bools, an awaitable) is
taken; whatever a reward module does wrong while it loads or runs is one line.

rloo.py's cases run in the fast subset; the other scripts' cases that take more than a few seconds are marked slow.
"""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from test_faults import RL, SCRIPTS, cli_error, every, run_tiny, tiny_flags

import common
import reward_model
import rewards
import sft
from common import ConfigError, TrainingError
from rewards import compute_rewards, load_reward_funcs

USER = [{"role": "user", "content": "Compute 1 + 1. Answer in the form <answer>N</answer>."}]
PAIRS = ("sft.py", "reward_model.py")


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def good_row(script: str, i: int) -> dict:
    """A row the script trains on: a standard prompt with its completion, pair or ground truth."""
    prompt = f"{i} + 1 = "
    if script == "sft.py":
        return {"prompt": prompt, "completion": f"<answer>{i + 1}</answer>"}
    if script == "reward_model.py":
        return {"prompt": prompt, "chosen": f"<answer>{i + 1}</answer>", "rejected": f"<answer>{i + 2}</answer>"}
    return {"prompt": prompt, "ground_truth": str(i + 1)}


# ----------------------------------------------------------------------------------------------------------------------
# Cause 2: rows that cannot be trained on
# ----------------------------------------------------------------------------------------------------------------------
BROKEN = [  # (the column, its value in row 3, the line's end)
    ("prompt", [{"role": "user"}], "'prompt' of row 3 of the 'train' split: message 0 has no content"),
    ("prompt", [{"content": "hi"}], "'prompt' of row 3 of the 'train' split: message 0 has no role"),
    ("prompt", [{"role": "human", "content": "hi"}], "message 0 has the unknown role 'human'"),
    ("prompt", [{"role": "user", "content": 7}], "message 0 has int content, expected a string"),
    ("prompt", 42, "'prompt' of row 3 of the 'train' split: expected a string or a list of messages, got int"),
    ("prompt", [{"role": "system", "content": "Be brief."}], "ends with the system's turn: nothing to answer"),
]


@pytest.mark.parametrize("column, value, line", BROKEN)
@pytest.mark.parametrize("script", SCRIPTS)
def test_a_row_that_means_nothing_is_one_line_naming_column_split_and_row(
    tmp_path, capsys, script, column, value, line
):
    """Refused as the data loads, before any model: fast in every script."""
    rows = [good_row(script, i) for i in range(8)]
    rows[3][column] = value
    data = write_jsonl(tmp_path / "data.jsonl", rows)
    said = cli_error(script, ["--dataset_name", data, "--output_dir", str(tmp_path / "out")], capsys)
    assert said.startswith("error: --dataset_name: ") and line in said
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "script, column, value, line",
    [
        ("sft.py", "completion", [{"role": "user", "content": "2"}], "ends with the user's turn, not the assistant's"),
        ("sft.py", "completion", [{"role": "assistant", "content": "2"}], "'prompt' and 'completion' must both be"),
        ("reward_model.py", "rejected", ["3"], "message 0 has no role or content"),
        ("reward_model.py", "chosen", {"text": "2"}, "'chosen' of row 3 of the 'train' split: expected a string"),
    ],
)
def test_completions_and_pairs_that_mean_nothing_are_one_line(tmp_path, capsys, script, column, value, line):
    rows = [good_row(script, i) for i in range(8)]
    rows[3][column] = value
    data = write_jsonl(tmp_path / "data.jsonl", rows)
    said = cli_error(script, ["--dataset_name", data, "--output_dir", str(tmp_path / "out")], capsys)
    assert said.startswith("error: --dataset_name: ") and line in said


def test_every_file_format_gives_the_same_rows(tmp_path, capsys):
    """csv gives an empty cell as None, parquet gives None, jsonl a missing key as None; whitespace and a conversation
    without text are empty too: each is skipped, and one line says how many and why."""
    prompts = ["1 + 1 = ", None, "   ", "2 + 2 = ", "3 + 3 = "]
    pd.DataFrame({"prompt": prompts, "ground_truth": ["2", "x", "y", "4", "6"]}).to_csv(tmp_path / "d.csv", index=False)
    pd.DataFrame({"prompt": prompts, "ground_truth": ["2", "x", "y", "4", "6"]}).to_parquet(tmp_path / "d.parquet")
    write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"prompt": USER},
            {"ground_truth": "x"},
            {"prompt": [{"role": "user", "content": " \n"}]},
            {"prompt": []},
            {"prompt": USER},
        ],
    )
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "train.csv").write_bytes((tmp_path / "d.csv").read_bytes())
    for name in ("d.csv", "d.parquet", "folder"):
        dataset = common.load_split(str(tmp_path / name), "train")
        assert dataset["prompt"] == ["1 + 1 = ", "2 + 2 = ", "3 + 3 = "]
        assert (
            capsys.readouterr()
            .out.strip()
            .endswith(
                "--dataset_name: skipping 2 of 5 rows of the 'train' split: 2 with an empty 'prompt' (row 1, ...)"
            )
        )
    assert common.load_split(str(tmp_path / "d.jsonl"), "train")["prompt"] == [USER, USER]
    assert "skipping 3 of 5 rows of the 'train' split: 3 with an empty 'prompt' (row 1, ...)" in capsys.readouterr().out
    (tmp_path / "none.csv").write_text("prompt,ground_truth\n,1\n  ,2\n")
    with pytest.raises(
        ConfigError, match="--dataset_name: the 'train' split of .* has no usable row \\(every row was skipped\\)"
    ):
        common.load_split(str(tmp_path / "none.csv"), "train")


def test_a_csv_ground_truth_read_as_floats_or_left_empty(tmp_path, capsys, tiny_model, tiny_tokenizer):
    """csv reads a numeric column with an empty cell as floats and None: 2.0 is the answer 2, and a row without a
    ground truth is not applicable to accuracy (None), said once, and left out of eval/accuracy."""
    import rloo
    from rewards import accuracy_reward, check_columns

    (tmp_path / "d.csv").write_text("prompt,ground_truth\n1 + 1 =,2\n2 + 2 =,\n3 + 3 =,6\n")
    dataset = common.load_split(str(tmp_path / "d.csv"), "train")
    assert dataset["ground_truth"] == [2.0, None, 6.0]
    funcs = load_reward_funcs("accuracy")
    check_columns(funcs, dataset)
    assert capsys.readouterr().out == (
        "--dataset_name: 1 of 3 rows have no 'ground_truth' (None), which reward function accuracy_reward needs: it "
        "gets None for them\n"
    )
    texts = ["<answer>2</answer>", "<answer>4</answer>", "<answer>6.0</answer>"]
    _, per_func = compute_rewards(
        funcs, torch.ones(1), dataset["prompt"], texts, [[]] * 3, {"ground_truth": dataset["ground_truth"]}
    )
    assert per_func[[0, 2], 0].tolist() == [1.0, 1.0] and per_func[1, 0].isnan()
    args = rloo.Args(num_generations_eval=1, max_completion_length=4)
    metrics = common.evaluate(tiny_model, tiny_tokenizer, dataset, args, {"accuracy": accuracy_reward}, seed=0)
    assert 0.0 <= metrics["eval/accuracy"] <= 1.0


@pytest.mark.parametrize("script", every(SCRIPTS))
def test_empty_rows_are_skipped_with_a_count_and_the_rest_trains(tmp_path, capsys, script):
    rows = [good_row(script, i) for i in range(10)]
    rows[2]["prompt"], rows[7]["prompt"] = "", None
    data = write_jsonl(tmp_path / "data.jsonl", rows)
    run_tiny(script, tmp_path / "out", dataset_name=data, max_steps=1)
    assert "--dataset_name: skipping 2 of 10 rows of the 'train' split: 2 with an empty 'prompt' (row 2, ...)" in (
        capsys.readouterr().out
    )
    assert [r["step"] for r in common.read_metrics(tmp_path / "out") if "step_time" in r] == [1]


def test_sft_skips_empty_completions_and_prompts_that_fill_max_length(tmp_path, tiny_tokenizer, capsys):
    rows = [good_row("sft.py", i) for i in range(6)]
    rows[1]["completion"] = " "
    rows[4]["completion"] = None
    data = write_jsonl(tmp_path / "data.jsonl", rows)
    dataset = common.load_split(data, "train", columns=sft.TEXT_COLUMNS)
    assert len(dataset) == 4 and "2 with an empty 'completion' (row 1, ...)" in capsys.readouterr().out
    from datasets import Dataset

    long = Dataset.from_list(
        [{"prompt": "1 + 1 = " * 20, "completion": " 2"}, {"prompt": "1 + 1 =", "completion": " 2"}]
    )
    (row,) = sft.tokenize(tiny_tokenizer, long, max_length=24)
    assert row["labels"][-1] == tiny_tokenizer.eos_token_id
    assert "--max_length 24: skipping 1 of 2 training rows whose prompt alone is that long" in capsys.readouterr().out
    two = Dataset.from_list([{"prompt": USER, "completion": [{"role": "assistant", "content": "a"}] * 2}])
    with pytest.raises(
        ConfigError, match="'completion' of training row 0: expected one assistant message, got 2 messages"
    ):
        sft.tokenize(tiny_tokenizer, two, max_length=24)


def test_reward_model_skips_pairs_without_a_preference_in_both_layouts(tmp_path, capsys):
    """TRL's explicit prompt (prompt + chosen/rejected) and implicit prompt (chosen/rejected hold the conversation)."""
    answer = lambda n: [{"role": "assistant", "content": f"<answer>{n}</answer>"}]  # noqa: E731
    explicit = [{"prompt": USER, "chosen": answer(2), "rejected": answer(n)} for n in (3, 2, 4, 5)]
    explicit[3]["rejected"] = [{"role": "assistant", "content": ""}]
    dataset = common.load_split(write_jsonl(tmp_path / "e.jsonl", explicit), "train", columns=reward_model.TEXT_COLUMNS)
    assert [row["rejected"] for row in dataset] == [answer(3), answer(4)]
    assert capsys.readouterr().out.strip() == (
        "--dataset_name: skipping 2 of 4 rows of the 'train' split: 1 with chosen equal to rejected (row 1), 1 with an "
        "empty 'rejected' (row 3)"
    )
    implicit = [{"chosen": USER + answer(2), "rejected": USER + answer(n)} for n in (3, 2)]
    dataset = common.load_split(write_jsonl(tmp_path / "i.jsonl", implicit), "train", columns=reward_model.TEXT_COLUMNS)
    assert dataset["rejected"] == [USER + answer(3)]
    implicit[0]["chosen"] = answer(2) + USER  # a conversation that ends with the user's turn scores no answer
    with pytest.raises(ConfigError, match="'chosen' of row 0 of the 'train' split: ends with the user's turn"):
        common.load_split(write_jsonl(tmp_path / "u.jsonl", implicit), "train", columns=reward_model.TEXT_COLUMNS)


def test_a_prompt_that_ends_with_the_assistants_turn_is_continued(tiny_tokenizer):
    """As TRL renders it (continue_final_message): the turn stays open, and the reward functions see the whole answer,
    the prompt without that turn."""
    prefilled = [*USER, {"role": "assistant", "content": "Let me think:"}]
    text = common.prompt_text(tiny_tokenizer, prefilled)
    assert text.endswith("<|im_start|>assistant\nLet me think:")
    assert common.prompt_text(tiny_tokenizer, USER).endswith("<|im_start|>assistant\n")
    assert rewards.reward_inputs(prefilled, " <answer>2</answer>") == (
        USER,
        [{"role": "assistant", "content": "Let me think: <answer>2</answer>"}],
    )
    seen = {}

    def spy(prompts, completions, **kwargs):
        seen.update(prompts=prompts, completions=completions)
        return [1.0]

    compute_rewards({"spy": spy}, torch.ones(1), [prefilled], [" <answer>2</answer>"], [[1]], {})
    assert seen == {
        "prompts": [USER],
        "completions": [[{"role": "assistant", "content": "Let me think: <answer>2</answer>"}]],
    }


@pytest.mark.parametrize("script", every(RL))
def test_rl_trains_on_prefilled_conversations_from_jsonl(tmp_path, script):
    """The reward functions of every RL script see the continued answer, and the prompt without its prefill."""
    rows = [{"prompt": [*USER, {"role": "assistant", "content": "<answer>"}], "ground_truth": "2"}] * 8
    (tmp_path / "check.py").write_text(
        "def continued(prompts, completions, **kwargs):\n"
        "    assert all(p[-1]['role'] == 'user' and c[0]['content'].startswith('<answer>')\n"
        "               for p, c in zip(prompts, completions))\n"
        "    return [1.0] * len(completions)\n"
    )
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    run_tiny(
        script, tmp_path / "out", dataset_name=data, reward_funcs=f"{tmp_path / 'check.py'}:continued", max_steps=1
    )
    assert len([r for r in common.read_metrics(tmp_path / "out") if "step_time" in r]) == 1


# ----------------------------------------------------------------------------------------------------------------------
# Cause 5: reward functions at the edges
# ----------------------------------------------------------------------------------------------------------------------
def scores(function, n: int = 3):
    return compute_rewards({"f": function}, torch.ones(1), ["p"] * n, ["c"] * n, [[]] * n, {})[1][:, 0]


@pytest.mark.parametrize(
    "returned",
    [
        lambda n: np.array([1.0, 0.0, 0.5], dtype=np.float32),
        lambda n: torch.tensor([1.0, 0.0, 0.5]),
        lambda n: (np.float32(1.0), np.int64(0), torch.tensor(0.5)),
        lambda n: [True, False, np.float16(0.5)],
        lambda n: (value for value in [1, 0, 0.5]),
    ],
    ids=["numpy array", "1-D tensor", "numpy and torch scalars in a tuple", "bools", "generator"],
)
def test_what_a_reasonable_reward_function_returns_is_taken(returned):
    assert scores(lambda completions, **kwargs: returned(len(completions))).tolist() == [1.0, 0.0, 0.5]


def test_none_is_not_applicable_in_any_container():
    returned = np.array([np.float32(1.0), None, np.int64(0)], dtype=object)
    assert scores(lambda completions, **kwargs: returned).isnan().tolist() == [
        False,
        True,
        False,
    ]


def test_awaitables_from_any_callable_are_awaited():
    """An object whose __call__ is async (a client with a connection pool, say) is awaited like an async function."""

    class Judge:
        async def __call__(self, completions, **kwargs):
            return [0.25] * len(completions)

    assert scores(Judge()).tolist() == [0.25] * 3


@pytest.mark.parametrize(
    "returned, line",
    [
        (
            "['1.0', '0.0', '0.5']",
            "reward function f: returned '1.0' for completion 0 (expected a finite number or None)",
        ),
        ("[1.0, float('inf'), 0.0]", "reward function f: returned inf for completion 1"),
        ("[[1.0], [0.0], [0.5]]", "reward function f: returned [1.0] for completion 0"),
        ("torch.tensor(1.0)", "reward function f: returned 1.0, not a list with one value per completion"),
        ("{'a': 1.0}", "reward function f: returned {'a': 1.0}, not a list"),
        ("torch.ones(2)", "reward function f: returned 2 values for 3 completions"),
    ],
)
def test_what_no_reward_function_should_return_is_one_line(returned, line):
    with pytest.raises(TrainingError, match=line.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        scores(lambda completions, **kwargs: eval(returned))


MODULES = [  # (the module's text, what --reward_funcs names in it, the line's end)
    ("def f(completions, **kwargs)\n    return [1.0]\n", "f", ": cannot import '{spec}': {path}:1: expected ':'"),
    ("import no_such_package\n", "f", ": cannot import '{spec}': ModuleNotFoundError: No module named"),
    ("x = 1 / 0\n", "f", ": cannot import '{spec}': ZeroDivisionError: division by zero"),
    ("def g(completions, **kwargs):\n    return [1.0]\n", "f", ": {path} has no function 'f'"),
    ("f = 0.5\n", "f", ": '{spec}' is a float, not a function"),
    ("class f:\n    pass\n", "f", ": '{spec}' is a type, not a function"),
    ("def f(completions):\n    return [1.0]\n", "f", ": reward function f does not take the keyword 'prompts'"),
    (
        "def f(prompts, completions, completion_ids):\n    return [1.0]\n",
        "f",
        "does not take the keyword 'ground_truth'",
    ),
]


@pytest.mark.parametrize("text, name, line", MODULES)
@pytest.mark.parametrize("script", every(RL))
def test_a_reward_module_that_does_not_load_is_one_line(tmp_path, capsys, script, text, name, line):
    path = tmp_path / "mine.py"
    path.write_text(text)
    spec = f"{path}:{name}"
    said = cli_error(script, [*tiny_flags(script), "--reward_funcs", spec, "--output_dir", str(tmp_path / "o")], capsys)
    assert said.startswith("error: --reward_funcs") and line.format(spec=spec, path=path) in said, said
    assert not (tmp_path / "o").exists()


def test_two_reward_functions_of_one_name_and_a_nameless_one(tmp_path):
    (tmp_path / "a.py").write_text("def format_reward(completions, **kwargs):\n    return [1.0] * len(completions)\n")
    with pytest.raises(ConfigError, match="--reward_funcs: two reward functions are named format_reward"):
        load_reward_funcs(f"format,{tmp_path / 'a.py'}:format_reward")
    (tmp_path / "b.py").write_text(
        "import functools\nimport rewards\nhalf = functools.partial(rewards.format_reward)\n"
    )
    assert list(load_reward_funcs(f"{tmp_path / 'b.py'}:half")) == ["half"]


@pytest.mark.parametrize("script", every(RL))
def test_numpy_and_torch_rewards_train_in_every_rl_script(tmp_path, script):
    path = tmp_path / "mine.py"
    path.write_text(
        "import numpy as np\nimport torch\n\n"
        "def np_reward(completions, **kwargs):\n"
        "    return np.array([len(c) % 2 for c in completions], dtype=np.int64)\n\n"
        "def torch_reward(completions, **kwargs):\n    return torch.tensor([float(len(c)) for c in completions])\n\n"
        "def bool_reward(completions, **kwargs):\n"
        "    return [np.bool_(len(c) > 3) if len(c) else None for c in completions]\n"
    )
    funcs = ",".join(f"{path}:{name}" for name in ("np_reward", "torch_reward", "bool_reward"))
    run_tiny(script, tmp_path / "out", reward_funcs=funcs, max_steps=1)
    (record,) = [r for r in common.read_metrics(tmp_path / "out") if "step_time" in r]
    assert record["rewards/torch_reward/mean"] > 0 and 0 <= record["rewards/np_reward/mean"] <= 1
