"""reward_model.py: the Bradley–Terry loss and pair accuracy on known values (the docstring's worked example), the
shipped pairs, a saved model that rewards.py scores as training did, margins (None among them), resume, a stop, LoRA,
bad input, and a default run that reaches the held-out accuracy target."""

import dataclasses
import json
import math
import re
import signal

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification

import common
import reward_model
from conftest import ROOT, one_line_error, read_metrics, stop_script
from hub_like import make_bf16_checkpoint
from reward_model import bradley_terry_loss, pair_accuracy
from rewards import (
    accuracy_reward,
    as_completion,
    extract_answer,
    format_reward,
    reward_model_function,
)


def rows(path: str) -> list[dict]:
    return [json.loads(line) for line in (ROOT / "data" / path).read_text().splitlines()]


def small_data(tmp_path) -> str:
    """A folder of 64 built-in pairs to train on and 16 held-out ones."""
    folder = tmp_path / "data"
    folder.mkdir(exist_ok=True)
    for split, n in (("train", 64), ("test", 16)):
        pairs = rows(f"arithmetic_preferences/{split}.jsonl")[::8][:n]  # one pair per problem
        (folder / f"{split}.jsonl").write_text(
            "".join(json.dumps(pair, ensure_ascii=False) + "\n" for pair in pairs)
        )
    return str(folder)


def scores(score, pairs: list[dict], side: str) -> list[float]:
    """`score`'s reward of each pair's `side` ("chosen" or "rejected") after its prompt."""
    prompts, completions = zip(*(as_completion(p["prompt"], p[side][0]["content"]) for p in pairs))
    return score(prompts=list(prompts), completions=list(completions))


def args(tmp_path, **overrides) -> reward_model.Args:
    """A run of a second or two: 3 steps of 8 pairs, no evaluation, no checkpoint."""
    small = dict(
        max_steps=3,
        train_batch_size=8,
        logging_steps=1,
        eval_strategy="no",
        save_steps=0,
        dataset_name=small_data(tmp_path),
    )
    return reward_model.Args(**{**small, "output_dir": str(tmp_path / "out"), **overrides})


def training(output_dir) -> list[dict]:
    return [
        {k: v for k, v in r.items() if k != "step_time"}
        for r in read_metrics(output_dir)
        if "loss" in r
    ]


def test_the_bradley_terry_loss_of_the_worked_example():
    """r_c = 2, r_r = 0: −log σ(2) = 0.127; with the margin m = 2: ln 2; with c = 0.01: + 0.01 · (2 + 0)²."""
    loss = lambda m=0.0, c=None: bradley_terry_loss(
        torch.tensor([2.0]), torch.tensor([0.0]), torch.tensor([m]), center_rewards_coefficient=c
    ).item()
    assert loss() == pytest.approx(math.log1p(math.exp(-2)))
    assert round(loss(), 3) == 0.127
    assert loss(m=2.0) == pytest.approx(math.log(2))
    assert loss(c=0.01) == pytest.approx(math.log1p(math.exp(-2)) + 0.04)


def test_the_loss_and_its_gradient_on_a_batch():
    chosen = torch.tensor([2.0, 0.0, -1.0], requires_grad=True)
    rejected = torch.tensor([0.0, 0.0, 1.0])
    loss = bradley_terry_loss(chosen, rejected, torch.zeros(3), center_rewards_coefficient=None)
    assert loss.tolist() == pytest.approx(
        [math.log1p(math.exp(-2)), math.log(2), math.log1p(math.exp(2))]
    )
    loss.mean().backward()
    assert chosen.grad.tolist() == pytest.approx(
        [-torch.sigmoid(-d).item() / 3 for d in torch.tensor([2, 0, -2.0])]
    )
    accuracy = pair_accuracy(torch.tensor([1.0, 0, 2, 3]), torch.tensor([0.0, 1, 2, 1]))
    assert accuracy.tolist() == [1, 0, 0.5, 1]


def test_the_shipped_pairs_prefer_the_right_answer_and_hold_out_the_test_problems():
    truth = {
        row["prompt"][0]["content"]: row["ground_truth"]
        for split in ("train", "test")
        for row in rows(f"arithmetic/{split}.jsonl")
    }
    prompts = {}
    for folder in ("arithmetic_preferences", "arithmetic_preferences_number"):
        for split in ("train", "test"):
            pairs = rows(f"{folder}/{split}.jsonl")
            questions = [pair["prompt"][0]["content"] for pair in pairs]
            problems = [row["prompt"][0]["content"] for row in rows(f"arithmetic/{split}.jsonl")]
            # 8 pairs per problem
            assert questions == [question for question in problems for _ in range(8)]
            prompts[folder, split] = set(questions)
            answers = [truth[q] for q in questions]
            chosen = [p["chosen"] for p in pairs]
            rejected = [p["rejected"] for p in pairs]
            assert (
                accuracy_reward(chosen, ground_truth=answers)
                == format_reward(chosen)
                == [1.0] * len(pairs)
            )
            assert accuracy_reward(rejected, ground_truth=answers) == [0.0] * len(pairs)
            broken = 1 - sum(format_reward(rejected)) / len(pairs)
            # form separates: a quarter have a broken format
            if folder == "arithmetic_preferences":
                assert 0.2 < broken < 0.3
            else:  # the same form, bare or worked, and only the number differs
                assert broken == 0
                for c, r, answer in zip(chosen, rejected, answers):
                    wrong = re.escape(extract_answer(r[0]["content"]))
                    right = re.sub(
                        rf"(= |<answer>){wrong}(?!\d)", rf"\g<1>{answer}", r[0]["content"]
                    )
                    assert right == c[0]["content"]
    train, test = (prompts["arithmetic_preferences", split] for split in ("train", "test"))
    assert not train & test


def test_a_run_saves_a_model_that_rewards_py_scores_as_training_did(tmp_path):
    reward_model.main(args(tmp_path, eval_strategy="steps", eval_steps=2, save_steps=2))
    out = tmp_path / "out"
    evals = [r for r in read_metrics(out) if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 2, 3]
    # the last evaluation is the saved model's: as rewards.py scores it, it wins that share of the held-out pairs
    score = reward_model_function(str(out), "cpu")
    lines = (tmp_path / "data" / "test.jsonl").read_text().splitlines()
    held_out = [json.loads(line) for line in lines]
    r_chosen, r_rejected = (scores(score, held_out, side) for side in ("chosen", "rejected"))
    wins = [c > r for c, r in zip(r_chosen, r_rejected)]
    assert evals[-1]["eval/accuracy"] == sum(wins) / len(wins)
    assert all("eval/loss" in r for r in evals)
    assert all("eval/margin" in r for r in evals)
    train = training(out)
    assert [r["step"] for r in train] == [1, 2, 3]
    for key in (
        "loss",
        "accuracy",
        "margin",
        "min_reward",
        "mean_reward",
        "max_reward",
        "grad_norm",
        "num_tokens",
    ):
        assert all(key in r for r in train), key
    assert [p.name for p in reward_model.checkpoints(out)] == ["checkpoint-2"]
    model = AutoModelForSequenceClassification.from_pretrained(out)
    tokenizer = common.load_tokenizer(str(out))
    assert model.config.num_labels == 1
    assert model.config.pad_token_id == tokenizer.pad_token_id
    assert all(p.dtype == torch.float32 for p in model.parameters())

    pairs = rows("arithmetic_preferences/test.jsonl")[:5]
    from datasets import Dataset

    tokenized = reward_model.tokenize_pairs(
        tokenizer, Dataset.from_list(pairs), reward_model.Args(), "test"
    )
    with torch.no_grad():
        chosen, _ = reward_model.pair_rewards(
            model.eval(), tokenized, tokenizer.pad_token_id, "cpu"
        )
    assert scores(score, pairs, "chosen") == pytest.approx(chosen.tolist(), abs=1e-5)


def test_string_pairs_without_a_prompt_with_margins_some_none(tmp_path, capsys):
    """A None margin is 0; a file has one split (no evaluation); a pair over --max_length is dropped, as TRL does."""
    pairs = [
        {
            "chosen": f"{a} + 1 = {a + 1}",
            "rejected": f"{a} + 1 = {a + 2}",
            "margin": None if a % 2 else 0.5,
        }
        for a in range(16)
    ]
    pairs[0]["chosen"] = "1 + 1 = 2" * 60
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(pair) + "\n" for pair in pairs))
    reward_model.main(
        args(tmp_path, dataset_name=str(tmp_path / "pairs.jsonl"), eval_strategy="steps")
    )
    assert "the train split: dropped 1 of 16 pairs over --max_length" in capsys.readouterr().out
    assert [r["step"] for r in read_metrics(tmp_path / "out")] == [1, 2, 3]


def test_a_bf16_checkpoint_trains_float32_weights_and_resume_gives_the_uninterrupted_run(tmp_path):
    model = str(make_bf16_checkpoint(tmp_path / "bf16"))
    full = args(
        tmp_path,
        model_name_or_path=model,
        max_steps=4,
        save_steps=2,
        eval_strategy="steps",
        eval_steps=2,
        center_rewards_coefficient=0.01,
    )
    reward_model.main(full)
    checkpoint = str(tmp_path / "out" / "checkpoint-2")
    reward_model.main(
        dataclasses.replace(
            full, output_dir=str(tmp_path / "resumed"), resume_from_checkpoint=checkpoint
        )
    )
    strip = lambda records: [
        {k: v for k, v in r.items() if k != "step_time"} for r in records if r["step"] > 2
    ]
    assert strip(read_metrics(tmp_path / "resumed")) == strip(read_metrics(tmp_path / "out"))
    final, again = (load_file(tmp_path / run / "model.safetensors") for run in ("out", "resumed"))
    assert all(final[k].dtype == torch.float32 for k in final)
    assert all(torch.equal(final[k], again[k]) for k in final)


def test_a_lora_reward_model_resumes_exactly_and_is_saved_merged_for_the_rl_scripts(tmp_path):
    lora = args(
        tmp_path,
        use_peft=True,
        lora_r=4,
        learning_rate=1e-2,
        save_merged_model=True,
        save_steps=2,
        bf16=True,
    )
    reward_model.main(lora)
    out = tmp_path / "out"
    assert (out / "adapter_config.json").exists()
    assert not (out / "model.safetensors").exists()
    adapter = load_file(out / "adapter_model.safetensors")
    assert all(t.dtype == torch.float32 for t in adapter.values())
    assert any("score" in k for k in adapter)
    checkpoint = str(out / "checkpoint-2")
    reward_model.main(
        dataclasses.replace(
            lora, output_dir=str(tmp_path / "resumed"), resume_from_checkpoint=checkpoint
        )
    )
    assert training(tmp_path / "resumed") == training(out)[2:]
    merged = AutoModelForSequenceClassification.from_pretrained(out / "merged")
    assert merged.config.num_labels == 1
    assert merged.score.weight.abs().sum() > 0
    score = reward_model_function(str(out / "merged"), "cpu")
    assert len(score(prompts=["a"], completions=["b"])) == 1


def test_sigterm_in_the_loop_saves_a_checkpoint_and_exits_143(tmp_path):
    out = tmp_path / "out"
    flags = ["--dataset_name", small_data(tmp_path)]
    flags += "--max_steps 100000 --train_batch_size 8 --eval_strategy no".split()
    returncode, stdout, stderr = stop_script(
        "reward_model.py", *flags, output_dir=out, signum=signal.SIGTERM
    )
    assert returncode == 143, stderr
    assert "Traceback" not in stderr, stderr
    (checkpoint,) = reward_model.checkpoints(out)
    assert stdout.count("interrupted at step") == 1
    assert str(checkpoint) in stdout


@pytest.mark.parametrize(
    "flags, line",
    [
        (["--learning_rate", "0"], "--learning_rate: must be positive, got 0.0"),
        (
            ["--center_rewards_coefficient", "-1"],
            "--center_rewards_coefficient: must be ≥ 0, got -1.0",
        ),
        (["--train_batch_size", "100"], "--train_batch_size: more than the 64 pairs"),
        (["--max_step", "3"], "unrecognized arguments: --max_step 3"),
        (["--dataset_name", "no/such/pairs.jsonl"], "--dataset_name no/such/pairs.jsonl: "),
        (
            ["--dataset_name", "{no_chosen}"],
            "--dataset_name: the train split has no 'chosen' column",
        ),
        (["--dataset_name", "{bad_margin}"], "row 0 of the train split: could not convert"),
        (["--dataset_name", "{mixed}"], "row 0 of the train split: can only concatenate"),
    ],
)
def test_bad_input_is_one_line_with_exit_status_2_and_nothing_written(
    tmp_path, flags, line, capsys
):
    files = {
        "{no_chosen}": '{"prompt": "1 + 1", "completion": "2"}\n',
        "{bad_margin}": '{"chosen": "2", "rejected": "3", "margin": "large"}\n',
        "{mixed}": '{"prompt": [{"role": "user", "content": "1"}], "chosen": "2", "rejected": "3"}\n',
    }
    for name, text in files.items():
        (tmp_path / f"{name[1:-1]}.jsonl").write_text(text * 8)
    flags = [str(tmp_path / f"{f[1:-1]}.jsonl") if f in files else f for f in flags]
    out = tmp_path / "out"
    defaults = ["--dataset_name", small_data(tmp_path)]
    defaults += "--train_batch_size 8 --eval_strategy no".split()
    assert line in one_line_error(
        reward_model, *defaults, *flags, "--output_dir", out, capsys=capsys
    )
    assert not out.exists() or not list(out.iterdir())


@pytest.mark.slow
def test_the_default_run_reaches_the_held_out_accuracy_target(tmp_path):
    reward_model.main(reward_model.Args(output_dir=str(tmp_path / "out")))
    evals = [r for r in read_metrics(tmp_path / "out") if "eval/accuracy" in r]
    assert evals[0]["eval/accuracy"] < 0.7
    assert evals[-1]["eval/accuracy"] >= 0.9
