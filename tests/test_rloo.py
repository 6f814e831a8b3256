"""rloo.py end to end: what a run writes, resume, stops, micro-batching, bad input, and a run that learns."""

import ast
import dataclasses
import json
import re
import signal

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import rloo
from conftest import (
    ROOT,
    error_line,
    one_line_error,
    read_metrics,
    run_main,
    run_script,
    stop_script,
)
from hub_like import (
    arithmetic_rows,
    make_bf16_checkpoint,
    make_deepmath_like_dataset,
    make_hub_like_checkpoint,
    make_turn_end_checkpoint,
)
from rewards import accuracy_reward


def args(tmp_path, **overrides) -> rloo.Args:
    """A run of a few seconds: 2 steps of 4 prompts × 2 completions, no evaluation, no checkpoint."""
    small = dict(
        max_steps=2,
        prompts_per_step=4,
        logging_steps=1,
        eval_steps=0,
        eval_strategy="no",
        save_steps=0,
    )
    return rloo.Args(**{**small, "output_dir": str(tmp_path / "out"), **overrides})


def training(output_dir) -> list[dict]:
    return [
        {k: v for k, v in r.items() if k != "step_time"}
        for r in read_metrics(output_dir)
        if "loss" in r
    ]


def test_a_run_writes_trls_metrics_a_loadable_model_and_checkpoints(tmp_path):
    rewards = dict(reward_funcs=["accuracy", "format"], reward_weights=["1", "0.2"])
    evaluation = dict(eval_strategy="steps", eval_steps=2, num_generations_eval=2)
    rloo.main(
        args(tmp_path, max_steps=3, save_steps=1, save_total_limit=2, **evaluation, **rewards)
    )
    out = tmp_path / "out"
    records = read_metrics(out)
    # at the start, every eval_steps, the end
    assert [r["step"] for r in records if "eval/reward" in r] == [0, 2, 3]
    assert {"eval/accuracy", "eval/accuracy_greedy", "eval/format", "eval/reward_greedy"} <= set(
        records[0]
    )
    train = training(out)
    assert [r["step"] for r in train] == [1, 2, 3]
    for key in (
        "reward",
        "reward_std",
        "frac_reward_zero_std",
        "rewards/accuracy_reward/mean",
        "kl",
        "entropy",
        "completions/mean_length",
        "completions/clipped_ratio",
        "loss",
        "grad_norm",
        "clip_ratio/low_mean",
        "clip_ratio/high_mean",
        "clip_ratio/region_mean",
        "learning_rate",
        "num_tokens",
    ):
        assert all(key in r for r in train), key
    # --save_total_limit 2
    assert [p.name for p in rloo.checkpoints(out)] == ["checkpoint-2", "checkpoint-3"]
    assert not list(out.glob(".checkpoint-*"))  # renamed into place when complete
    checkpoint = out / "checkpoint-3"
    assert json.loads((checkpoint / "trainer_state.json").read_text())["step"] == 3
    # what --config reads back
    assert json.loads((checkpoint / "args.json").read_text())["max_steps"] == 3
    # the weights once, in Hugging Face format
    assert not list((checkpoint / "state").glob("*.safetensors"))
    final = AutoModelForCausalLM.from_pretrained(out)
    assert all(p.dtype == torch.float32 for p in final.parameters())
    assert torch.equal(
        final.lm_head.weight, AutoModelForCausalLM.from_pretrained(checkpoint).lm_head.weight
    )


def test_resume_gives_the_uninterrupted_runs_metrics_and_weights(tmp_path):
    full = args(
        tmp_path, max_steps=4, save_steps=2, num_iterations=2, eval_strategy="steps", eval_steps=2
    )
    rloo.main(full)
    checkpoint = str(tmp_path / "out" / "checkpoint-2")
    rloo.main(
        dataclasses.replace(
            full, output_dir=str(tmp_path / "resumed"), resume_from_checkpoint=checkpoint
        )
    )
    assert training(tmp_path / "resumed") == training(tmp_path / "out")[2:]
    final, again = (load_file(tmp_path / run / "model.safetensors") for run in ("out", "resumed"))
    assert all(torch.equal(final[k], again[k]) for k in final)


def test_resume_from_a_stopped_run_equals_the_uninterrupted_run(tmp_path):
    """Ctrl-C after step 2 saves checkpoint-2; resuming it gives the uninterrupted run's metrics.jsonl exactly."""
    flags = "--max_steps 4 --prompts_per_step 4 --logging_steps 1 --eval_steps 0".split()
    flags += "--save_steps 0 --eval_strategy steps".split()
    run_main(rloo, *flags, "--output_dir", tmp_path / "full")
    out = tmp_path / "stopped"
    returncode, stdout, stderr = stop_script(
        "rloo.py", *flags, output_dir=out, signum=signal.SIGINT, once='"step": 2'
    )
    assert returncode == 130, stderr
    assert "Traceback" not in stderr, stderr
    (checkpoint,) = rloo.checkpoints(out)
    assert f"interrupted at step {checkpoint.name.split('-')[1]}: saved {checkpoint}" in stdout
    run_main(rloo, *flags, "--output_dir", out, "--resume_from_checkpoint", "latest")
    strip = lambda records: [{k: v for k, v in r.items() if k != "step_time"} for r in records]
    assert strip(read_metrics(out)) == strip(read_metrics(tmp_path / "full"))


def test_sigterm_in_the_loop_saves_a_checkpoint_and_exits_143(tmp_path):
    out = tmp_path / "out"
    flags = "--max_steps 1000 --prompts_per_step 4 --eval_strategy no --logging_steps 1".split()
    returncode, stdout, stderr = stop_script(
        "rloo.py", *flags, output_dir=out, signum=signal.SIGTERM
    )
    assert returncode == 143, stderr
    assert "Traceback" not in stderr, stderr
    (checkpoint,) = rloo.checkpoints(out)
    assert stdout.count("interrupted at step") == 1
    assert str(checkpoint) in stdout


def test_micro_batching_does_not_change_the_update(tmp_path, recorded_gradients):
    """The whole batch's advantages are known before the first backward pass, so micro-batches that split groups (2 of
    each prompt's 4 completions) accumulate the one-batch gradient, batch-wide normalization included."""
    whole = args(
        tmp_path,
        max_steps=1,
        num_generations=4,
        normalize_advantages=True,
        output_dir=str(tmp_path / "a"),
    )
    rloo.main(whole)
    rloo.main(dataclasses.replace(whole, micro_batch_size=2, output_dir=str(tmp_path / "b")))
    one_batch, micro_batches = recorded_gradients
    assert one_batch.abs().max() > 0
    assert torch.allclose(one_batch, micro_batches, rtol=1e-4, atol=1e-7)
    assert training(tmp_path / "a")[0]["loss"] == pytest.approx(
        training(tmp_path / "b")[0]["loss"], abs=1e-6
    )


def test_beta_zero_loads_no_reference_model(tmp_path, monkeypatch):
    loads = []
    load = AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(
        AutoModelForCausalLM, "from_pretrained", lambda *a, **k: loads.append(a) or load(*a, **k)
    )
    rloo.main(args(tmp_path, beta=0.0, max_steps=1))
    assert len(loads) == 1
    assert "kl" not in training(tmp_path / "out")[0]
    rloo.main(args(tmp_path, beta=0.05, max_steps=1, output_dir=str(tmp_path / "with_reference")))
    assert len(loads) == 3


@pytest.mark.parametrize(
    "make", [make_bf16_checkpoint, make_hub_like_checkpoint, make_turn_end_checkpoint]
)
def test_hub_like_checkpoints_train_in_float32_without_dropout(tmp_path, make, monkeypatch):
    """A bf16 checkpoint trains with float32 master weights; a Llama with attention dropout and a shipped sampling
    config trains with dropout off; a turn-end token that is not the tokenizer's EOS ends completions."""
    model = str(make(tmp_path / "model"))
    trained = []
    load_for_training = rloo.load_for_training
    monkeypatch.setattr(
        rloo,
        "load_for_training",
        lambda *a, **k: trained.append(load_for_training(*a, **k)) or trained[-1],
    )
    rloo.main(args(tmp_path, model_name_or_path=model, max_steps=1))
    (policy,) = trained
    assert all(p.dtype == torch.float32 for p in policy.parameters())
    assert all(
        v == 0.0
        for m in policy.modules()
        for n, v in vars(m).items()
        if isinstance(v, float) and "drop" in n
    )
    (record,) = training(tmp_path / "out")
    # the model ends nearly every turn with <|im_end|>, the second end id
    if make is make_turn_end_checkpoint:
        assert record["completions/clipped_ratio"] < 0.5


def test_lora_trains_an_adapter_whose_reference_is_the_base(tmp_path):
    rloo.main(args(tmp_path, use_peft=True, lora_r=4, learning_rate=1e-3, save_steps=1))
    out = tmp_path / "out"
    assert (out / "adapter_config.json").exists()
    assert not (out / "model.safetensors").exists()
    (first, _) = training(out)
    # step 1: the adapter is zero, so π_θ = π_ref
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)
    rloo.main(
        args(
            tmp_path,
            use_peft=True,
            lora_r=4,
            learning_rate=1e-3,
            max_steps=3,
            resume_from_checkpoint="latest",
        )
    )
    assert [r["step"] for r in training(out)] == [1, 2, 3]


def test_bf16_and_gradient_checkpointing_train_float32_master_weights(tmp_path):
    rloo.main(args(tmp_path, bf16=True, gradient_checkpointing=True, max_steps=1))
    (record,) = training(tmp_path / "out")
    assert record["grad_norm"] > 0
    weights = load_file(tmp_path / "out" / "model.safetensors")
    assert all(t.dtype == torch.float32 for t in weights.values())


def test_a_config_file_is_read_and_the_command_line_wins(tmp_path):
    config = tmp_path / "recipe.yaml"
    config.write_text(
        "max_steps: 1\nnum_generations: 4\nprompts_per_step: 2\nreward_funcs: [accuracy, format]\n"
    )
    out = tmp_path / "out"
    flags = "--num_generations 2 --eval_strategy no".split()
    run_main(rloo, "--config", config, *flags, "--output_dir", out)
    saved = json.loads((out / "args.json").read_text())
    assert (saved["max_steps"], saved["num_generations"], saved["reward_funcs"]) == (
        1,
        2,
        ["accuracy", "format"],
    )
    # a run's args.json is a config
    run_main(rloo, "--config", out / "args.json", "--output_dir", tmp_path / "again")
    assert json.loads((tmp_path / "again" / "args.json").read_text())["num_generations"] == 2


def test_string_prompts_from_a_compressed_file_and_log_completions(tmp_path, capsys):
    """A string prompt reaches the model as it is, with no chat template: these close the user's turn and open the
    assistant's, as the embedded model's template does, so that the model answers them."""
    import gzip

    assistant_turn = "<|im_end|>\n<|im_start|>assistant\n"
    rows = [
        {
            "prompt": f"Compute {a} + 2. Answer in the form <answer>N</answer>.{assistant_turn}",
            "ground_truth": str(a + 2),
        }
        for a in range(8)
    ]
    with gzip.open(tmp_path / "data.jsonl.gz", "wt") as f:
        f.write("\n".join(json.dumps(r) for r in rows))
    rloo.main(
        args(
            tmp_path,
            dataset_name=str(tmp_path / "data.jsonl.gz"),
            max_steps=1,
            log_completions=True,
            num_completions_to_print=8,
        )
    )
    out = capsys.readouterr().out  # tqdm.write: stdout
    assert "[step 1] 'Compute" in out
    # the logged accuracy is that of the 8 printed completions, each checked against its row's answer
    answers = {row["prompt"]: row["ground_truth"] for row in rows}
    lines = [line for line in out.splitlines() if line.startswith("[step 1] ")]
    printed = [re.fullmatch(r"\[step 1\] (.+?) → (.+)  reward \S+", line) for line in lines]
    prompts = [ast.literal_eval(match[1]) for match in printed]
    completions = [ast.literal_eval(match[2]) for match in printed]
    right = accuracy_reward(completions, ground_truth=[answers[p] for p in prompts])
    assert len(right) == 8
    assert training(tmp_path / "out")[0]["rewards/accuracy_reward/mean"] == sum(right) / 8


def test_unscorable_completions_stay_out_of_the_statistics(tmp_path):
    """A row without a ground truth makes its completions unscorable (NaN): not a 0 in the mean reward."""
    rows = [
        {"prompt": f"Compute {a} + 2.", "ground_truth": None if a % 2 else str(a + 2)}
        for a in range(8)
    ]
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    rloo.main(
        args(tmp_path, dataset_name=str(tmp_path / "data.jsonl"), max_steps=1, prompts_per_step=8)
    )
    (record,) = training(tmp_path / "out")
    assert record["reward"] == record["rewards/accuracy_reward/mean"]
    assert record["reward"] is not None


def test_a_data_file_named_without_its_folder_loads_from_the_working_directory(
    tmp_path, monkeypatch
):
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "1 + 1", "ground_truth": "2"}\n' * 3)
    monkeypatch.chdir(tmp_path)
    split = rloo.load_split(rloo.Args(dataset_name="prompts.jsonl"), "train")
    assert split["prompt"][:] == ["1 + 1"] * 3


def test_dropout_is_off_where_a_model_keeps_its_rate_as_a_float(tmp_path):
    """OPT's layers pass `self.dropout`, a float, to F.dropout: it is turned off too."""
    from transformers import OPTConfig, OPTForCausalLM

    config = OPTConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        ffn_dim=32,
        num_attention_heads=2,
        max_position_embeddings=64,
        dropout=0.1,
        attention_dropout=0.1,
        activation_dropout=0.1,
    )
    OPTForCausalLM(config).save_pretrained(tmp_path / "opt")
    model = rloo.load_for_training(rloo.Args(), str(tmp_path / "opt"))
    for module in model.modules():
        assert getattr(module, "p", 0.0) == 0.0 or not isinstance(module, torch.nn.Dropout)
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            rate = getattr(module, name, 0.0)
            assert not isinstance(rate, float) or rate == 0.0, (type(module).__name__, name)


def test_report_to_tensorboard_writes_its_events(tmp_path):
    rloo.main(args(tmp_path, max_steps=1, report_to=["tensorboard"]))
    assert list((tmp_path / "out").rglob("events.out.tfevents.*"))


def test_a_non_finite_update_stops_before_it_is_applied(tmp_path, capsys):
    """A learning rate of 1e30 makes step 1's update blow the weights up: step 2's loss is not finite, and step 2 is
    not applied or saved."""
    flags = "--learning_rate 1e30 --max_steps 3 --prompts_per_step 4 --eval_strategy no".split()
    line = one_line_error(
        rloo, *flags, "--save_steps", "1", "--output_dir", tmp_path / "out", capsys=capsys
    )
    assert line.startswith("error: step 2: the loss or the gradient norm is not finite")
    assert [p.name for p in rloo.checkpoints(tmp_path / "out")] == ["checkpoint-1"]


@pytest.mark.parametrize(
    "flags, line",
    [
        (["--num_generations", "1"], "--num_generations: the baseline needs G ≥ 2, got 1"),
        (["--max_steps", "x"], "--max_steps/--max-steps: invalid int value: 'x'"),
        (["--max_step", "3"], "unrecognized arguments: --max_step 3"),
        (["--learning_rate", "0"], "--learning_rate: must be positive, got 0.0"),
        (["--seed", "-1"], "--seed: must be in [0, 2**32), got -1"),
        (
            ["--kl_estimator", "k2"],
            "--kl_estimator/--kl-estimator: invalid choice: 'k2' (choose from 'k1', 'k3')",
        ),
        (["--load_in_4bit"], "--load_in_4bit: it needs --use_peft"),
        (["--dataset_name", "no/such/data.jsonl"], "--dataset_name no/such/data.jsonl: "),
        (["--dataset_train_split", "validation"], "--dataset_train_split: no 'validation'"),
        (["--reward_funcs", "acuracy"], "--reward_funcs: unknown reward function 'acuracy'"),
        (
            ["--dataset_name", "{questions}"],
            "--dataset_name: the train split has no 'prompt' column",
        ),
        (
            ["--dataset_name", "{no_answers}"],
            "reward function accuracy_reward needs a column solution or ground_truth",
        ),
        (
            ["--reward_funcs", "{short}"],
            "reward function short returned 1 values for 8 completions",
        ),
    ],
)
def test_bad_input_is_one_line_with_exit_status_2_and_nothing_written(
    tmp_path, flags, line, capsys
):
    (tmp_path / "questions.jsonl").write_text('{"question": "1 + 1", "ground_truth": "2"}\n' * 8)
    (tmp_path / "no_answers.jsonl").write_text('{"prompt": "1 + 1"}\n' * 8)
    (tmp_path / "short.py").write_text("def short(completions, **kwargs):\n    return [1.0]\n")
    paths = {
        "{questions}": "questions.jsonl",
        "{no_answers}": "no_answers.jsonl",
        "{short}": "short.py:short",
    }
    flags = [str(tmp_path / paths[f]) if f in paths else f for f in flags]
    out = tmp_path / "out"
    flags = [*flags, "--prompts_per_step", "4", "--eval_strategy", "no", "--output_dir", out]
    assert line in one_line_error(rloo, *flags, capsys=capsys)
    assert not out.exists() or not list(out.iterdir())


def test_the_script_itself_says_bad_input_in_one_line(tmp_path):
    result = run_script(
        ROOT / "rloo.py", "--num_generations", "1", "--output_dir", tmp_path / "out"
    )
    assert error_line(result) == "error: --num_generations: the baseline needs G ≥ 2, got 1"


def test_a_fresh_run_refuses_another_runs_folder_unless_told(tmp_path, capsys):
    rloo.main(args(tmp_path, max_steps=1))
    line = one_line_error(rloo, "--output_dir", tmp_path / "out", capsys=capsys)
    assert "--output_dir: " in line
    assert "--resume_from_checkpoint latest" in line
    rloo.main(args(tmp_path, max_steps=1, overwrite_output_dir=True, save_steps=1))
    assert [r["step"] for r in read_metrics(tmp_path / "out")] == [1]


@pytest.mark.slow
def test_the_quick_start_learns(tmp_path):
    """`python rloo.py --num_generations 4`, as the README says: held-out accuracy rises, sampled and greedy."""
    run_main(rloo, "--num_generations", "4", "--output_dir", tmp_path / "out")
    evals = [r for r in read_metrics(tmp_path / "out") if "eval/accuracy" in r]
    first, last = evals[0], evals[-1]
    assert last["eval/accuracy"] - first["eval/accuracy"] >= 0.15
    assert last["eval/accuracy_greedy"] >= first["eval/accuracy_greedy"]


def test_trls_math_recipe_layout_trains_with_math_verify(tmp_path):
    """trl-lib/DeepMath-103K's layout (a dataset card, parquet shards, a LaTeX `solution`), by --dataset_config.
    math-verify scores the LaTeX solutions ($7$, -2, \\frac{56}{8}) as the plain check scores the same questions'
    ground_truth: the same completions get the same held-out accuracy."""
    data = str(make_deepmath_like_dataset(tmp_path / "deepmath"))
    evaluation = dict(eval_strategy="steps", num_generations_eval=1)
    rloo.main(
        args(
            tmp_path,
            dataset_name=data,
            dataset_config="default",
            reward_funcs=["accuracy_reward"],
            **evaluation,
        )
    )
    records = read_metrics(tmp_path / "out")
    assert "rewards/accuracy_reward/mean" in records[1]
    plain = tmp_path / "plain"
    plain.mkdir()
    for split, n in (("train", 64), ("test", 16)):  # the same rows as the DeepMath-like folder
        lines = [json.dumps(row) + "\n" for row in arithmetic_rows(split)[:n]]
        (plain / f"{split}.jsonl").write_text("".join(lines))
    plain_run = dict(dataset_name=str(plain), output_dir=str(tmp_path / "plain_out"))
    rloo.main(args(tmp_path, max_steps=1, **plain_run, **evaluation))
    # step 0's evaluation samples from the seed: the same completions in both runs
    assert records[0]["eval/accuracy"] == read_metrics(tmp_path / "plain_out")[0]["eval/accuracy"]
