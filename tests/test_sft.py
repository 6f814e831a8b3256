"""sft.py: the loss on the completion tokens alone (its worked example), the shipped data, what a run writes, resume, a
stop, LoRA, bad input, and an untrained model built by tools/make_tiny_model.py that learns the task."""

import dataclasses
import gzip
import importlib.util
import json
import math
import signal

import pytest
import torch
from datasets import Dataset
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import common
import sft
from conftest import EMBEDDED, ROOT, one_line_error, read_metrics, run_main, stop_script
from rewards import accuracy_reward, extract_answer, format_reward


def small_data(tmp_path) -> str:
    """A folder of 78 demonstrations to train on (the shipped held-out ones) and 8 held-out rows."""
    rows = (ROOT / "data" / "arithmetic_sft" / "test.jsonl").read_text().splitlines()
    folder = tmp_path / "data"
    folder.mkdir(exist_ok=True)
    (folder / "train.jsonl").write_text("\n".join(rows) + "\n")
    (folder / "test.jsonl").write_text("\n".join(rows[:8]) + "\n")
    return str(folder)


def args(tmp_path, **overrides) -> sft.Args:
    """A run of a second or two: 2 steps of 8 sequences, no evaluation, no checkpoint."""
    small = dict(
        max_steps=2,
        train_batch_size=8,
        logging_steps=1,
        eval_strategy="no",
        save_steps=0,
        num_generations_eval=1,
        dataset_name=small_data(tmp_path),
    )
    return sft.Args(**{**small, "output_dir": str(tmp_path / "out"), **overrides})


def token_accuracy(model, tokenizer, rows: list[dict]) -> float:
    """The share of the completion tokens of `rows` that `model` ranks first, one row at a time."""
    right = total = 0
    for row in sft.tokenize(tokenizer, Dataset.from_list(rows), sft.Args(), "test"):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([row["input_ids"]])).logits[0]
        labels = torch.tensor(row["labels"][1:])  # position t predicts token t + 1
        scored = labels != -100
        right += (logits[:-1].argmax(-1)[scored] == labels[scored]).sum().item()
        total += scored.sum().item()
    return right / total


def answer_scores(model, tokenizer, rows: list[dict], greedy: bool) -> tuple[float, float]:
    """The accuracy and the format of `model`'s completions of the prompts of `rows`, sampled as sft.py's
    evaluation samples them: from the seed, every prompt in one call."""
    texts = [common.prompt_text(tokenizer, row["prompt"]) for row in rows]
    config = common.sampling_config(model, tokenizer, sft.Args(), greedy=greedy)
    torch.manual_seed(sft.Args().seed)
    ids = common.generate(model.eval(), tokenizer, texts, config)["completion_ids"]
    mask, _ = common.end_of_completion(ids, config.eos_token_id)
    completions, _ = common.decode(tokenizer, ids, mask)
    truths = [row["ground_truth"] for row in rows]
    accuracy = accuracy_reward(completions, ground_truth=truths)
    return sum(accuracy) / len(rows), sum(format_reward(completions)) / len(rows)


def training(output_dir) -> list[dict]:
    return [
        {k: v for k, v in r.items() if k != "step_time"}
        for r in read_metrics(output_dir)
        if "loss" in r
    ]


def load_tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_prompt_is_masked_and_the_completion_ends_with_eos(tiny_tokenizer):
    row = {
        "prompt": [
            {"role": "user", "content": "Compute 7 × 8. Answer in the form <answer>N</answer>."}
        ],
        "completion": [{"role": "assistant", "content": "7 × 8 = 56 <answer>56</answer>"}],
    }
    (tokenized,) = sft.tokenize(tiny_tokenizer, Dataset.from_list([row]), sft.Args(), "train")
    prompt = common.prompt_text(tiny_tokenizer, row["prompt"])  # as the RL scripts render it
    n = len(tiny_tokenizer(prompt, add_special_tokens=False).input_ids)
    labels = tokenized["labels"]
    assert labels[:n] == [-100] * n
    assert labels[n:] == tokenized["input_ids"][n:]
    assert labels[-1] == tiny_tokenizer.eos_token_id
    assert tiny_tokenizer.decode(labels[n:-1]) == "7 × 8 = 56 <answer>56</answer>"
    short = sft.Args(max_length=n + 2)
    (cut,) = sft.tokenize(tiny_tokenizer, Dataset.from_list([row]), short, "train")
    # the first tokens
    assert cut == {"input_ids": tokenized["input_ids"][: n + 2], "labels": labels[: n + 2]}


def test_the_loss_is_the_mean_over_the_completion_tokens_as_in_the_worked_example():
    """A prompt of two tokens, then three completion tokens and EOS that π_θ gives probabilities
    1/2, 1/4, 1 and 1/2: L = (ln 2 + ln 4 + 0 + ln 2) / 4 = ln 2, whatever the logits at the
    prompt; three of the four are ranked first."""
    probabilities = torch.tensor(
        [[0.5, 0.25, 0.25, 0], [0.5, 0.25, 0.25, 0], [1.0, 0, 0, 0], [0.25, 0.5, 0.25, 0]]
    )
    positions = [torch.randn(1, 4), probabilities.log(), torch.randn(1, 4)]
    logits = torch.cat(positions)[None]  # (1, L = 6, V = 4)
    labels = torch.tensor([[-100, -100, 0, 1, 0, 1]])  # position t's logits predict token t + 1
    nll, mask, correct = sft.token_losses(logits, labels)
    assert mask.sum() == 4
    assert (nll.sum() / mask.sum()).item() == pytest.approx(math.log(2))
    assert (correct.sum() / mask.sum()).item() == 0.75  # mean_token_accuracy


def test_the_shipped_data_is_the_noisy_demonstrator_that_tools_make_data_writes():
    files = load_tool("make_data").datasets()
    for path, rows in files.items():
        raw = (ROOT / "data" / path).read_bytes()
        text = (gzip.decompress(raw) if path.endswith(".gz") else raw).decode()
        assert [json.loads(line) for line in text.splitlines()] == rows, path
    train, test = files["arithmetic_sft/train.jsonl.gz"], files["arithmetic_sft/test.jsonl"]
    prompts = [row["prompt"][0]["content"] for row in train]
    assert len(train) == 78_000
    assert all(prompts.count(p) == 200 for p in set(prompts[::200]))  # 390 problems
    held_out = [
        json.loads(line)["prompt"]
        for line in (ROOT / "data/arithmetic/test.jsonl").read_text().splitlines()
    ]
    # the RL scripts' held-out prompts, one demonstration each
    assert [row["prompt"] for row in test] == held_out
    texts = [row["completion"][0]["content"] for row in train]
    guesses = [
        int(extract_answer(t)) - int(row["ground_truth"])
        for t, row in zip(texts, train)
        if t[0] == "<"
    ]
    assert set(guesses) == {-2, -1, 1, 2}
    assert 0.49 < len(guesses) / len(train) < 0.51
    worked = [(t, row["ground_truth"]) for t, row in zip(texts, train) if t[0] != "<"]
    assert all(extract_answer(t) == truth for t, truth in worked)
    assert all(t.split(" = ")[1].startswith(truth + " ") for t, truth in worked)
    assert format_reward(texts) == [1.0] * len(texts)


def test_a_run_writes_trls_metrics_evaluations_checkpoints_and_a_loadable_model(tmp_path):
    sft.main(
        args(
            tmp_path,
            max_steps=3,
            save_steps=1,
            save_total_limit=2,
            eval_strategy="steps",
            eval_steps=2,
        )
    )
    out = tmp_path / "out"
    evals = [r for r in read_metrics(out) if "eval/loss" in r]
    assert [r["step"] for r in evals] == [0, 2, 3]  # at the start, every eval_steps, the end
    for key in (
        "eval/mean_token_accuracy",
        "eval/accuracy",
        "eval/accuracy_greedy",
        "eval/format",
        "eval/reward",
    ):
        assert all(key in r for r in evals), key
    assert all(r["eval/reward"] == r["eval/accuracy"] for r in evals)  # weights 1 and 0
    train = training(out)
    assert [r["step"] for r in train] == [1, 2, 3]
    for key in (
        "loss",
        "mean_token_accuracy",
        "entropy",
        "grad_norm",
        "learning_rate",
        "num_tokens",
    ):
        assert all(key in r for r in train), key
    kept = [p.name for p in sft.checkpoints(out)]
    assert kept == ["checkpoint-2", "checkpoint-3"]  # --save_total_limit 2
    assert json.loads((out / "args.json").read_text())["max_steps"] == 3
    final = AutoModelForCausalLM.from_pretrained(out)
    assert all(p.dtype == torch.float32 for p in final.parameters())
    assert torch.equal(
        final.lm_head.weight,
        AutoModelForCausalLM.from_pretrained(out / "checkpoint-3").lm_head.weight,
    )
    # the last evaluation is the saved model's, measured here again on the 8 held-out rows
    lines = (tmp_path / "data" / "test.jsonl").read_text().splitlines()
    held_out = [json.loads(line) for line in lines]
    tokenizer = common.load_tokenizer(str(out))
    last = evals[-1]
    assert last["eval/mean_token_accuracy"] == token_accuracy(final, tokenizer, held_out)
    accuracy, answer_format = answer_scores(final, tokenizer, held_out, greedy=False)
    assert last["eval/accuracy"] == accuracy
    assert last["eval/format"] == answer_format
    accuracy, _ = answer_scores(final, tokenizer, held_out, greedy=True)
    assert last["eval/accuracy_greedy"] == accuracy


def test_string_pairs_from_one_file_train_under_bf16_with_float32_weights(tmp_path):
    """A file has one split: no evaluation. bf16 autocast and gradient checkpointing train float32 master weights."""
    rows = [
        {"prompt": f"Compute {a} + 1. ", "completion": f"<answer>{a + 1}</answer>"}
        for a in range(16)
    ]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    overrides = dict(
        dataset_name=str(tmp_path / "pairs.jsonl"), eval_strategy="steps", max_steps=1
    )
    sft.main(args(tmp_path, bf16=True, gradient_checkpointing=True, **overrides))
    (record,) = read_metrics(tmp_path / "out")
    assert record["grad_norm"] > 0
    assert 0 < record["mean_token_accuracy"] < 1
    assert all(
        t.dtype == torch.float32
        for t in load_file(tmp_path / "out" / "model.safetensors").values()
    )


def test_resume_gives_the_uninterrupted_runs_metrics_evaluations_and_weights(tmp_path):
    full = args(tmp_path, max_steps=4, save_steps=2, eval_strategy="steps", eval_steps=2)
    sft.main(full)
    checkpoint = str(tmp_path / "out" / "checkpoint-2")
    sft.main(
        dataclasses.replace(
            full, output_dir=str(tmp_path / "resumed"), resume_from_checkpoint=checkpoint
        )
    )
    strip = lambda records: [
        {k: v for k, v in r.items() if k != "step_time"} for r in records if r["step"] > 2
    ]
    assert strip(read_metrics(tmp_path / "resumed")) == strip(read_metrics(tmp_path / "out"))
    final, again = (load_file(tmp_path / run / "model.safetensors") for run in ("out", "resumed"))
    assert all(torch.equal(final[k], again[k]) for k in final)


def test_lora_trains_an_adapter_without_dropout_and_saves_the_merged_model(tmp_path, monkeypatch):
    dropouts = []
    load_for_training = sft.load_for_training

    def load_and_record_dropout(*a, **k):
        model = load_for_training(*a, **k)
        dropouts.extend(
            module.p for module in model.modules() if isinstance(module, torch.nn.Dropout)
        )
        return model

    monkeypatch.setattr(sft, "load_for_training", load_and_record_dropout)
    sft.main(
        args(
            tmp_path,
            use_peft=True,
            lora_r=4,
            lora_dropout=0.1,
            learning_rate=1e-2,
            save_merged_model=True,
        )
    )
    assert dropouts
    assert set(dropouts) == {0.0}  # LoRA's dropout too: --disable_dropout
    out = tmp_path / "out"
    assert (out / "adapter_config.json").exists()
    assert not (out / "model.safetensors").exists()
    merged = AutoModelForCausalLM.from_pretrained(out / "merged")
    base = AutoModelForCausalLM.from_pretrained(EMBEDDED)
    q_proj = lambda model: model.model.layers[0].self_attn.q_proj.weight
    assert merged.dtype == torch.float32
    assert not torch.equal(q_proj(merged), q_proj(base))


def test_a_stop_in_the_loop_saves_a_checkpoint_and_exits_130(tmp_path):
    out = tmp_path / "out"
    flags = ["--dataset_name", small_data(tmp_path)]
    flags += "--max_steps 100000 --train_batch_size 8 --eval_strategy no".split()
    returncode, stdout, stderr = stop_script(
        "sft.py", *flags, output_dir=out, signum=signal.SIGINT
    )
    assert returncode == 130, stderr
    assert "Traceback" not in stderr, stderr
    (checkpoint,) = sft.checkpoints(out)
    step = json.loads((checkpoint / "trainer_state.json").read_text())["step"]
    assert f"interrupted at step {step}: saved {checkpoint}" in stdout


@pytest.mark.parametrize(
    "flags, line",
    [
        (["--max_length", "0"], "--max_length: must be positive, got 0"),
        (
            ["--train_batch_size", "x"],
            "--train_batch_size/--train-batch-size: invalid int value: 'x'",
        ),
        (["--train_batch_size", "100"], "--train_batch_size: more than the 78 rows"),
        (["--load_in_4bit"], "--load_in_4bit: it needs --use_peft"),
        (["--dataset_train_split", "validation"], "--dataset_train_split: no 'validation'"),
        (
            ["--dataset_name", "{no_completion}"],
            "--dataset_name: the train split has no 'completion' column",
        ),
        (
            ["--dataset_name", "{no_prompt}"],
            "--dataset_name: the train split has no 'prompt' column",
        ),
        (["--dataset_name", "{null_completion}"], "row 0 of the train split: 'NoneType'"),
    ],
)
def test_bad_input_is_one_line_with_exit_status_2_and_nothing_written(
    tmp_path, flags, line, capsys
):
    files = {
        "{no_completion}": '{"prompt": "1 + 1"}\n',
        "{no_prompt}": '{"question": "1", "completion": "2"}\n',
        "{null_completion}": '{"prompt": "1 + 1", "completion": null}\n',
    }
    for name, text in files.items():
        (tmp_path / f"{name[1:-1]}.jsonl").write_text(text * 8)
    flags = [str(tmp_path / f"{f[1:-1]}.jsonl") if f in files else f for f in flags]
    out = tmp_path / "out"
    defaults = ["--dataset_name", small_data(tmp_path)]
    defaults += "--train_batch_size 8 --eval_strategy no".split()
    assert line in one_line_error(sft, *defaults, *flags, "--output_dir", out, capsys=capsys)
    assert not out.exists() or not list(out.iterdir())


@pytest.mark.slow
def test_an_untrained_model_from_tools_learns_the_task(tmp_path):
    """tools/make_tiny_model.py builds models/tiny-arith's tokenizer around an untrained model; 120 steps of SFT on the
    built-in data take its held-out loss from chance to below 1 and teach it the answer format."""
    load_tool("make_tiny_model").make_tiny_model(str(tmp_path / "init"))
    built, shipped = (
        json.loads((path / "tokenizer.json").read_text())["model"]
        for path in (tmp_path / "init", ROOT / "models/tiny-arith")
    )
    assert built == shipped  # the same vocabulary and merges
    flags = "--max_steps 120 --eval_steps 0 --num_generations_eval 1".split()
    folders = ["--model_name_or_path", tmp_path / "init", "--output_dir", tmp_path / "out"]
    run_main(sft, *flags, *folders)
    evals = [r for r in read_metrics(tmp_path / "out") if "eval/loss" in r]
    first, last = evals[0], evals[-1]
    assert first["eval/loss"] > 4
    assert last["eval/loss"] < 1
    assert first["eval/format_greedy"] == 0
    assert last["eval/format_greedy"] >= 0.9
