"""reward_model.py: the Bradley–Terry loss and pair accuracy on toy numbers, the built-in pairs, that the saved model
scores what rewards.reward_model_function scores, bad inputs, resume, LoRA, and a run that reaches the accuracy
target."""

import dataclasses
import json
import math
import re

import pytest
import torch
from safetensors.torch import load_file

import common
import reward_model
from common import ConfigError
from reward_model import bradley_terry_loss, pair_accuracy
from rewards import accuracy_reward, extract_answer, format_reward, reward_model_function

FAST = dict(max_steps=3, train_batch_size=8, pairs_per_problem=1, logging_steps=1, eval_steps=0)


def args(tmp_path, **overrides) -> reward_model.Args:
    return reward_model.Args(**{"output_dir": str(tmp_path / "out"), **FAST, **overrides})


def training_records(output_dir):
    return [{k: v for k, v in r.items() if k != "step_time"} for r in common.read_metrics(output_dir) if "loss" in r]


def test_bradley_terry_loss_on_a_toy_batch():
    chosen, rejected = torch.tensor([2.0, 0.0, -1.0]), torch.tensor([0.0, 0.0, 1.0])
    # −log σ(2), −log σ(0) = log 2, −log σ(−2)
    expected = (math.log1p(math.exp(-2)) + math.log(2) + math.log1p(math.exp(2))) / 3
    assert bradley_terry_loss(chosen, rejected).item() == pytest.approx(expected)
    # a margin m asks for r_c − r_r > m: −log σ(2 − 2) = log 2 for the first pair
    margins = torch.tensor([2.0, 0.0, 0.0])
    assert bradley_terry_loss(chosen, rejected, margins).item() == pytest.approx(
        (math.log(2) * 2 + math.log1p(math.exp(2))) / 3
    )
    # centering adds c · mean((r_c + r_r)²) = 0.01 · (4 + 0 + 0) / 3
    assert bradley_terry_loss(chosen, rejected, center_rewards_coefficient=0.01).item() == pytest.approx(
        expected + 0.04 / 3
    )


def test_bradley_terry_gradient_pushes_chosen_up_and_rejected_down():
    chosen, rejected = torch.zeros(2, requires_grad=True), torch.zeros(2, requires_grad=True)
    bradley_terry_loss(chosen, rejected).backward()
    assert chosen.grad.tolist() == [-0.25, -0.25] and rejected.grad.tolist() == [0.25, 0.25]  # −σ(0)/B, +σ(0)/B


def test_pair_accuracy_counts_ties_as_half():
    assert pair_accuracy(torch.tensor([1.0, 0.0, 2.0, 3.0]), torch.tensor([0.0, 1.0, 2.0, 1.0])) == pytest.approx(
        (1 + 0 + 0.5 + 1) / 4
    )


def test_builtin_pairs_prefer_the_right_answer_and_hold_out_the_test_problems():
    train = reward_model.arithmetic_preference_dataset("train", 4, seed=0)
    test = reward_model.arithmetic_preference_dataset("test", 4, seed=0)
    assert len(train) == 4 * len(common.arithmetic_split("train")) and len(test) == 4 * len(
        common.arithmetic_split("test")
    )
    answers = {common.arithmetic_question(a, op, b): str(answer) for a, op, b, answer in common.arithmetic_problems()}
    for dataset in (train, test):
        correct = [answers[p[0]["content"]] for p in dataset["prompt"]]
        assert accuracy_reward(dataset["chosen"], ground_truth=correct) == [1.0] * len(dataset)
        assert format_reward(dataset["chosen"]) == [1.0] * len(dataset)
        assert accuracy_reward(dataset["rejected"], ground_truth=correct) == [0.0] * len(dataset)
        broken = 1 - sum(format_reward(dataset["rejected"])) / len(dataset)
        assert 0.15 < broken < 0.35  # about a quarter have a broken format
    assert not {p[0]["content"] for p in train["prompt"]} & {p[0]["content"] for p in test["prompt"]}


def test_number_pairs_have_one_form_and_differ_only_in_the_number():
    answers = {common.arithmetic_question(a, op, b): str(answer) for a, op, b, answer in common.arithmetic_problems()}
    for split in ("train", "test"):
        pairs = reward_model.arithmetic_preference_dataset(split, 4, seed=0, pairs="number")
        assert len(pairs) == 4 * len(common.arithmetic_split(split))
        correct = [answers[p[0]["content"]] for p in pairs["prompt"]]
        chosen, rejected = [c[0]["content"] for c in pairs["chosen"]], [r[0]["content"] for r in pairs["rejected"]]
        assert accuracy_reward(pairs["chosen"], ground_truth=correct) == [1.0] * len(pairs) and accuracy_reward(
            pairs["rejected"], ground_truth=correct
        ) == [0.0] * len(pairs)
        assert format_reward(pairs["chosen"]) == format_reward(pairs["rejected"]) == [1.0] * len(pairs)
        wrong = [extract_answer(r) for r in rejected]
        same_but_the_number = [
            re.sub(rf"(= |<answer>){re.escape(w)}(?!\d)", lambda m, a=a: m.group(1) + a, r)
            for r, w, a in zip(rejected, wrong, correct)
        ]
        assert same_but_the_number == chosen
        bare = sum(c.startswith("<answer>") for c in chosen) / len(pairs)
        near = sum(abs(int(w) - int(a)) <= 2 for w, a in zip(wrong, correct)) / len(pairs)
        assert 0.35 < bare < 0.65 and 0.35 < near < 0.65  # half bare, half worked; half off by ±1 or ±2
    # the demonstrator's pairs are the default and did not change: form tells them apart
    assert (
        reward_model.arithmetic_preference_dataset("test", 2, seed=0).to_list()
        == reward_model.arithmetic_preference_dataset("test", 2, seed=0, pairs="demonstrator").to_list()
    )


def test_short_run_on_number_pairs(tmp_path):
    reward_model.main(args(tmp_path, arithmetic_pairs="number"))
    assert [r["step"] for r in common.read_metrics(tmp_path / "out") if "eval/accuracy" in r] == [0, 3]


def test_short_run_saves_a_model_that_the_rl_scripts_score_the_same_way(tmp_path):
    from transformers import AutoModelForSequenceClassification

    reward_model.main(args(tmp_path, eval_steps=2))
    out = tmp_path / "out"
    records = common.read_metrics(out)
    assert [r["step"] for r in records if "eval/accuracy" in r] == [0, 2, 3]
    assert all(0.0 <= r["eval/accuracy"] <= 1.0 for r in records if "eval/accuracy" in r)
    assert [r["step"] for r in training_records(out)] == [1, 2, 3]
    model = AutoModelForSequenceClassification.from_pretrained(out)
    tokenizer = common.load_tokenizer(str(out))
    assert model.config.num_labels == 1 and model.config.pad_token_id == tokenizer.pad_token_id

    pairs = reward_model.arithmetic_preference_dataset("test", 1, seed=0).select(range(5))
    rows = reward_model.tokenize_pairs(tokenizer, pairs, 128)
    with torch.no_grad():
        chosen, _ = reward_model.pair_rewards(model.eval(), rows, tokenizer.pad_token_id, "cpu")
    completions = [c[0]["content"] for c in pairs["chosen"]]
    score = reward_model_function(str(out), "cpu")
    prompts = pairs["prompt"]
    scored = score(prompts=prompts, completions=[common.as_completion(p, c) for p, c in zip(prompts, completions)])
    assert scored == pytest.approx(chosen.tolist(), abs=1e-5)


def test_standard_pairs_without_prompt_and_with_a_margin_column(tmp_path):
    data = tmp_path / "pairs.jsonl"
    rows = [{"chosen": f"{a} + 1 = {a + 1}", "rejected": f"{a} + 1 = {a + 2}", "margin": 0.5} for a in range(16)]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    reward_model.main(args(tmp_path, dataset_name=str(data)))
    assert [r["step"] for r in training_records(tmp_path / "out")] == [1, 2, 3]
    assert not [
        r for r in common.read_metrics(tmp_path / "out") if "eval/accuracy" in r
    ]  # a single file has no test split


def test_over_long_pairs_are_dropped(tmp_path, capsys):
    data = tmp_path / "pairs.jsonl"
    rows = [{"prompt": "q", "chosen": "a" * (200 if i == 0 else 1), "rejected": "b"} for i in range(9)]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    reward_model.main(args(tmp_path, dataset_name=str(data), max_steps=1))
    assert "dropped 1 of 9 pairs longer than --max_length 128" in capsys.readouterr().out


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(learning_rate=0.0), "--learning_rate: must be positive"),
        (dict(lr_scheduler_type="bogus"), "--lr_scheduler_type: unknown scheduler 'bogus'"),
        (dict(max_steps=0), "--max_steps: must be positive"),
        (dict(pairs_per_problem=0), "--pairs_per_problem: must be positive"),
        (dict(arithmetic_pairs="digits"), "--arithmetic_pairs: expected one of demonstrator, number, got 'digits'"),
        (dict(train_batch_size=10_000), "--train_batch_size: 10000 exceeds the 312 training pairs"),
        (dict(model_name_or_path="/no/such/model"), "--model_name_or_path: cannot load a tokenizer"),
        (dict(dataset_name="/no/such/pairs.jsonl"), "--dataset_name: no such file"),
        (dict(report_to="tensorbord"), "--report_to: unknown tracker 'tensorbord'"),
        (dict(resume_from_checkpoint="latest"), "--resume_from_checkpoint latest: no checkpoint"),
    ],
)
def test_bad_input_is_a_config_error_naming_the_flag(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        reward_model.main(args(tmp_path, **overrides))
    assert not (tmp_path / "out").exists()


def test_dataset_without_chosen_column(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": "1 + 1", "completion": "2"}\n' * 8)
    with pytest.raises(ConfigError, match="--dataset_name: the dataset has no 'chosen' column"):
        reward_model.main(args(tmp_path, dataset_name=str(data)))


def test_resume_reproduces_the_uninterrupted_run(tmp_path):
    full = args(tmp_path, max_steps=4, save_steps=2)
    reward_model.main(full)
    reward_model.main(
        dataclasses.replace(
            full, output_dir=str(tmp_path / "resumed"), resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2")
        )
    )
    assert training_records(tmp_path / "resumed") == training_records(tmp_path / "out")[2:]
    final, again = (
        load_file(tmp_path / "out" / "model.safetensors"),
        load_file(tmp_path / "resumed" / "model.safetensors"),
    )
    assert all(torch.equal(final[k], again[k]) for k in final)


def test_lora_reward_model_merges_into_a_loadable_model(tmp_path):
    from transformers import AutoModelForSequenceClassification

    reward_model.main(args(tmp_path, use_peft=True, lora_r=4, save_merged_model=True))
    out = tmp_path / "out"
    assert (out / "adapter_config.json").exists() and not (out / "model.safetensors").exists()
    merged = AutoModelForSequenceClassification.from_pretrained(out / "merged")
    assert merged.score.weight.abs().sum().item() > 0
    score = reward_model_function(str(out / "merged"), "cpu")
    assert len(score(prompts=["a"], completions=["b"])) == 1


@pytest.mark.slow
def test_default_run_reaches_the_held_out_accuracy_target(tmp_path):
    reward_model.main(reward_model.Args(output_dir=str(tmp_path / "out")))
    evals = [r for r in common.read_metrics(tmp_path / "out") if "eval/accuracy" in r]
    assert evals[-1]["eval/accuracy"] >= 0.9
