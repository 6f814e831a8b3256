"""Nothing lost, one line for every mistake (issue 10), in every script where it applies.

Faults: a run stopped by Ctrl-C or SIGTERM keeps a checkpoint, a second signal while that checkpoint is written does not
destroy it, a stop during the final evaluation keeps the trained model, `latest` resumes the newest complete
checkpoint, a full disk keeps the previous checkpoint, a run owns its --output_dir. Mistakes: one line
`error: --flag: ...`, exit status 2, nothing written.
"""

import errno
import json
import shutil
import signal
import subprocess
import sys

import pytest
import torch

import common
import grpo
import ppo
import reinforce
import reward_model
import rloo
import sft
from common import ConfigError, TrainingError
from conftest import ROOT, logged, start_run, wait_for

SCRIPTS = {
    "rloo.py": rloo,
    "grpo.py": grpo,
    "reinforce.py": reinforce,
    "ppo.py": ppo,
    "sft.py": sft,
    "reward_model.py": reward_model,
}
RL = ("rloo.py", "grpo.py", "reinforce.py", "ppo.py")
SAMPLING = (*RL, "sft.py")  # the scripts that generate (sft.py for its evaluation)
TINY = {  # in-process runs of a step or two
    "rloo.py": dict(prompts_per_step=4, max_steps=2, eval_steps=0, logging_steps=1, save_steps=0),
    "grpo.py": dict(prompts_per_step=4, num_generations=4, max_steps=2, eval_steps=0, logging_steps=1, save_steps=0),
    "reinforce.py": dict(prompts_per_step=4, max_steps=2, eval_steps=0, logging_steps=1, save_steps=0),
    "ppo.py": dict(prompts_per_step=4, num_ppo_epochs=1, max_steps=2, eval_steps=0, logging_steps=1, save_steps=0),
}
NOISE = ("Removed shared tensor", "Writing model shards", "LOAD REPORT")


def cli_error(script: str, argv: list[str], capsys) -> str:
    """Run the script's command line in this process; it must exit with status 2 and end stderr with its one error
    line (before it, at most the progress bars of loading data and a model): that line."""
    module = SCRIPTS[script]
    with pytest.raises(SystemExit) as exit_info:
        common.cli(module.main, module.Args, argv)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().split("\n")
    assert [line for line in lines if "error" in line.lower() or "Traceback" in line] == lines[-1:], lines
    return lines[-1]


# ----------------------------------------------------------------------------------------------------------------------
# Faults
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("script", [pytest.param(s, marks=[] if s == "rloo.py" else pytest.mark.slow) for s in SCRIPTS])
def test_sigterm_saves_a_checkpoint_and_exits_143_quietly(tmp_path, interrupt_run, script):
    """What a scheduler sends before it kills a job is handled like Ctrl-C: finish the step, save, say how to resume.
    No noise a user cannot act on (tied-embedding warnings, shard progress bars, the new-head load report)."""
    checkpoint = interrupt_run(script, tmp_path / "out", signum=signal.SIGTERM)
    assert common.checkpoint_problem(checkpoint) is None
    assert not [noise for noise in NOISE if noise in interrupt_run.stderr]
    assert not (tmp_path / "out" / common.LOCK_FILE).exists()  # the lock goes with the run


@pytest.mark.parametrize("second", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_a_second_signal_while_the_checkpoint_is_written_does_not_destroy_it(tmp_path, second):
    out, flag = tmp_path / "out", tmp_path / "saving"
    process = start_run("rloo.py", out, slow=("checkpoint", flag))
    wait_for(logged(out, "reward"), process)
    process.send_signal(signal.SIGINT)
    wait_for(flag.exists, process)  # the checkpoint is being written (slowly)
    process.send_signal(second)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode in (130, -signal.SIGTERM), stderr  # stopped at once, but only after the write
    assert "Traceback" not in stderr
    checkpoint = common.resolve_checkpoint("latest", str(out))
    assert torch.load(checkpoint / "training_state.pt", weights_only=False)["step"] == max(
        r["step"] for r in common.read_metrics(out)
    )
    assert not list(out.glob(".checkpoint-*"))


def test_a_stop_during_the_final_evaluation_keeps_the_trained_model(tmp_path):
    from transformers import AutoModelForCausalLM

    out, flag = tmp_path / "out", tmp_path / "evaluating"
    process = start_run(
        "rloo.py", out, "--max_steps", "2", "--num_generations_eval", "1", slow=("final_evaluation", flag)
    )
    wait_for(flag.exists, process)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130
    assert stderr.strip().splitlines()[-1].startswith("stopped at once by Ctrl-C") and "Traceback" not in stderr
    assert AutoModelForCausalLM.from_pretrained(out) is not None  # the model of step 2, saved before the evaluation


def test_latest_resumes_the_newest_complete_checkpoint(tmp_path, capsys):
    """checkpoint-best, a half-copied checkpoint-99, a truncated training_state.pt, a leftover temporary folder and a
    torn last metrics line are all skipped, each said; the run resumes from checkpoint-2."""
    out = tmp_path / "out"
    rloo.main(rloo.Args(output_dir=str(out), **{**TINY["rloo.py"], "save_steps": 1}))
    shutil.copytree(out / "checkpoint-1", out / "checkpoint-best")
    shutil.copytree(out / "checkpoint-2", out / "checkpoint-99")
    optimizer = out / "checkpoint-99" / "accelerator_state" / "optimizer.bin"
    optimizer.write_bytes(optimizer.read_bytes()[:100])
    shutil.copytree(out / "checkpoint-2", out / "checkpoint-50")
    state = out / "checkpoint-50" / "training_state.pt"
    state.write_bytes(state.read_bytes()[:50])
    shutil.copytree(out / "checkpoint-2", out / ".checkpoint-70.tmp")
    with (out / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "rew')  # killed mid-write
    capsys.readouterr()
    assert common.resolve_checkpoint("latest", str(out)).name == "checkpoint-2"
    said = capsys.readouterr().out
    assert (
        "checkpoint-99 (accelerator_state/optimizer.bin has 100 of" in said
        and "checkpoint-50 (training_state.pt does not load" in said
    )
    rloo.main(rloo.Args(output_dir=str(out), resume_from_checkpoint="latest", **{**TINY["rloo.py"], "max_steps": 3}))
    assert [r["step"] for r in common.read_metrics(out) if "reward" in r] == [1, 2, 3]


def test_a_full_disk_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    out = tmp_path / "out"
    save = torch.save

    def disk_full_at_step_2(obj, path, *args, **kwargs):
        if str(path).endswith("training_state.pt") and obj["step"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", disk_full_at_step_2)
    with pytest.raises(
        ConfigError,
        match=r"--output_dir: cannot write .*checkpoint-2 \(No space left on device\); the earlier checkpoints are",
    ):
        rloo.main(rloo.Args(output_dir=str(out), **{**TINY["rloo.py"], "max_steps": 3, "save_steps": 1}))
    assert common.checkpoint_problem(out / "checkpoint-1") is None
    assert not (out / "checkpoint-2").exists() and not list(out.glob(".checkpoint-*"))


@pytest.mark.parametrize("script", RL)
def test_a_reward_function_that_raises_stops_the_run_after_a_checkpoint(tmp_path, script):
    module = tmp_path / "flaky.py"
    module.write_text(
        "calls = []\n\ndef flaky(completions, **kwargs):\n    calls.append(1)\n    if len(calls) == 2:\n"
        "        raise KeyError('answer')\n    return [1.0] * len(completions)\n"
    )
    out = tmp_path / "out"
    with pytest.raises(
        TrainingError, match=r"reward function flaky: raised KeyError: 'answer' \(at step 2\); saved .*checkpoint-1"
    ):
        SCRIPTS[script].main(SCRIPTS[script].Args(output_dir=str(out), reward_funcs=f"{module}:flaky", **TINY[script]))
    assert common.checkpoint_problem(out / "checkpoint-1") is None


@pytest.mark.parametrize("returned", ["0.5", "None"])
def test_a_reward_function_must_return_a_list(tmp_path, returned):
    module = tmp_path / "scalar.py"
    module.write_text(f"def scalar(completions, **kwargs):\n    return {returned}\n")
    with pytest.raises(
        TrainingError, match=f"reward function scalar: returned {returned}, not a list with one value per completion"
    ):
        rloo.main(rloo.Args(output_dir=str(tmp_path / "out"), reward_funcs=f"{module}:scalar", **TINY["rloo.py"]))


def test_the_error_line_starts_on_a_line_of_its_own(tmp_path):
    """Not after the progress bar (tqdm ends its lines with a carriage return only)."""
    module = tmp_path / "flaky.py"
    module.write_text(
        "calls = []\n\ndef flaky(completions, **kwargs):\n    calls.append(1)\n    if len(calls) == 3:\n"
        "        raise ValueError('boom')\n    return [1.0] * len(completions)\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "rloo.py"),
            "--output_dir",
            str(tmp_path / "out"),
            "--reward_funcs",
            f"{module}:flaky",
            "--max_steps",
            "5",
            "--prompts_per_step",
            "4",
            "--eval_steps",
            "0",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.split("\n")[-2].startswith(
        "error: reward function flaky: raised ValueError: boom (at step 3); saved"
    )
    assert "Traceback" not in result.stderr


# ----------------------------------------------------------------------------------------------------------------------
# Output folders
# ----------------------------------------------------------------------------------------------------------------------
def test_a_fresh_run_into_another_runs_folder_stops_unless_asked_to_continue_or_start_over(tmp_path):
    out = tmp_path / "out"
    tiny = {**TINY["rloo.py"], "max_steps": 1, "save_steps": 1}
    rloo.main(rloo.Args(output_dir=str(out), **tiny))
    before = (out / "metrics.jsonl").read_text()
    with pytest.raises(
        ConfigError,
        match="--output_dir: .* holds another run \\(checkpoint-1, metrics.jsonl\\): continue it with "
        "--resume_from_checkpoint latest, start over with --overwrite_output_dir",
    ):
        rloo.main(rloo.Args(output_dir=str(out), **tiny))
    assert (out / "metrics.jsonl").read_text() == before
    rloo.main(rloo.Args(output_dir=str(out), resume_from_checkpoint="latest", **{**tiny, "max_steps": 2}))
    assert [r["step"] for r in common.read_metrics(out) if "reward" in r] == [1, 2]
    rloo.main(rloo.Args(output_dir=str(out), overwrite_output_dir=True, **{**tiny, "save_steps": 0}))
    assert [r["step"] for r in common.read_metrics(out) if "reward" in r] == [1] and not list(out.glob("checkpoint-*"))


def test_a_live_runs_lock_stops_a_second_run_and_a_dead_runs_lock_does_not(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (out / common.LOCK_FILE).write_text(json.dumps({"pid": other.pid, "host": common.socket.gethostname()}))
        with pytest.raises(ConfigError, match=f"--output_dir: .* is in use by another run \\(pid {other.pid}\\)"):
            rloo.main(rloo.Args(output_dir=str(out), **TINY["rloo.py"]))
        assert sorted(p.name for p in out.iterdir()) == [common.LOCK_FILE]  # nothing written
    finally:
        other.kill()
        other.wait()
    capsys.readouterr()
    rloo.main(rloo.Args(output_dir=str(out), **TINY["rloo.py"]))  # a crashed run's lock is stale
    assert f"taking over the stale lock of a run that is gone (pid {other.pid})" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------------------------------
# Mistakes: one line, exit 2, nothing written
# ----------------------------------------------------------------------------------------------------------------------
MISTAKES = [  # (scripts, flags, the line's start)
    (SCRIPTS, ["--logging_steps", "0"], "error: --logging_steps: must be positive, got 0"),
    (SCRIPTS, ["--per_device_eval_batch_size", "0"], "error: --per_device_eval_batch_size: must be positive, got 0"),
    (SCRIPTS, ["--warmup_ratio", "-1"], "error: --warmup_ratio: must be in [0, 1], got -1.0"),
    (SCRIPTS, ["--max_grad_norm", "0"], "error: --max_grad_norm: must be positive, got 0.0"),
    (SCRIPTS, ["--save_steps", "-1"], "error: --save_steps: must be ≥ 0, got -1"),
    (SCRIPTS, ["--lora_dropout", "1"], "error: --lora_dropout: must be in [0, 1), got 1.0"),
    (SCRIPTS, ["--num_generatoins", "4"], "error: --num_generatoins: unknown flag"),
    (SCRIPTS, ["--max_steps", "ten"], "error: --max_steps: invalid int value: 'ten'"),
    (
        SCRIPTS,
        ["--dataset_train_split", "validation"],
        "error: --dataset_train_split: the built-in arithmetic task trains on 'train'",
    ),
    (SCRIPTS, ["--dataset_test_split", "train"], "error: --dataset_test_split: 'train' is also --dataset_train_split"),
    (SCRIPTS, ["--report_to", "mlflow"], "error: --report_to: expected none, tensorboard or wandb"),
    (
        SCRIPTS,
        ["--resume_from_checkpoint", "latest", "--overwrite_output_dir"],
        "error: --overwrite_output_dir: starts over",
    ),
    (SAMPLING, ["--num_generations_eval", "0"], "error: --num_generations_eval: must be positive, got 0"),
    (SAMPLING, ["--top_p", "0"], "error: --top_p: must be in (0, 1] (1.0 = off), got 0.0"),
    (SAMPLING, ["--top_p", "1.5"], "error: --top_p: must be in (0, 1] (1.0 = off), got 1.5"),
    (SAMPLING, ["--top_k", "-1"], "error: --top_k: must be ≥ 0, got -1"),
    (
        SAMPLING,
        ["--max_completion_length", "200"],
        "error: --max_completion_length: 200 tokens do not fit the model's context of 128",
    ),
    (
        ("sft.py", "reward_model.py"),
        ["--max_length", "512"],
        "error: --max_length: 512 exceeds the model's context of 128 tokens",
    ),
    (
        ("rloo.py", "reinforce.py"),
        ["--reward_clip_range", "5", "-5"],
        "error: --reward_clip_range: expected low ≤ high, got 5.0 -5.0",
    ),
    (RL, ["--reward_weights", "abc"], "error: --reward_weights: expected comma-separated numbers, got 'abc'"),
    (("rloo.py", "grpo.py", "reinforce.py"), ["--epsilon", "0"], "error: --epsilon: must be positive, got 0.0"),
    (
        ("ppo.py",),
        ["--num_generation", "4"],
        "error: --num_generation: unknown flag (did you mean --num_generations_eval?)",
    ),
]


@pytest.mark.parametrize(
    "script, flags, line", [(script, flags, line) for scripts, flags, line in MISTAKES for script in scripts]
)
def test_a_bad_flag_is_one_line_and_exit_2_before_anything_is_written(tmp_path, capsys, script, flags, line):
    out = tmp_path / "out"
    assert cli_error(script, [*flags, "--output_dir", str(out)], capsys).startswith(line)
    assert not out.exists()


@pytest.mark.parametrize("script", SCRIPTS)
def test_output_dir_that_is_a_file(tmp_path, capsys, script):
    (tmp_path / "taken").write_text("")
    line = cli_error(script, ["--output_dir", str(tmp_path / "taken" / "out")], capsys)
    assert line == f"error: --output_dir: {tmp_path / 'taken'} is a file, not a folder"


@pytest.mark.parametrize("script", SCRIPTS)
def test_an_empty_data_file(tmp_path, capsys, script):
    (tmp_path / "empty.jsonl").write_text("")
    line = cli_error(
        script, ["--dataset_name", str(tmp_path / "empty.jsonl"), "--output_dir", str(tmp_path / "out")], capsys
    )
    assert line == f"error: --dataset_name: {tmp_path / 'empty.jsonl'} is empty"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("script", RL)
def test_a_dataset_without_the_column_a_reward_function_needs(tmp_path, capsys, script):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a} + 1 ="}) + "\n" for a in range(8)))
    line = cli_error(
        script, ["--dataset_name", str(data), "--output_dir", str(tmp_path / "out"), "--prompts_per_step", "4"], capsys
    )
    assert line.startswith(
        "error: --dataset_name: the dataset has no 'ground_truth' column, which reward function accuracy_reward needs"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("script", RL)
def test_a_prompt_longer_than_the_models_context(tmp_path, capsys, script):
    data = tmp_path / "data.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": "1 + 1 = " * (60 if a == 5 else 1), "ground_truth": "2"}) + "\n" for a in range(8)
        )
    )
    line = cli_error(
        script, ["--dataset_name", str(data), "--output_dir", str(tmp_path / "out"), "--prompts_per_step", "4"], capsys
    )
    assert line.startswith("error: --dataset_name: prompt 5 of the 'train' split is ")
    assert line.endswith("tokens, more than the model's context of 128")


def test_required_columns_come_from_the_signature():
    from rewards import accuracy_reward, format_reward, required_columns

    def mine(prompts, completions, completion_ids, answer, *, unit, hint=None, **kwargs):
        return []

    assert required_columns(accuracy_reward) == ["ground_truth"]
    assert required_columns(format_reward) == []
    assert required_columns(mine) == ["answer", "unit"]
