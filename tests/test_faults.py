"""Nothing lost, one line for every mistake (issue 10), in every script where it applies.

Faults: a run stopped by Ctrl-C or SIGTERM keeps a checkpoint, a second signal while that checkpoint is written does not
destroy it, a stop during an evaluation outside the loop is one line and keeps the trained model, `latest` resumes the
newest complete checkpoint, a full disk keeps the previous checkpoint, a run owns its --output_dir (a lock with a
heartbeat). Mistakes: one line `error: --flag: ...`, exit status 2, nothing written.

rloo.py's cases run in the fast subset; the other scripts' cases that take more than a few seconds are marked slow.
"""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors import SafetensorError
from transformers import modeling_utils

import common
import grpo
import ppo
import reinforce
import reward_model
import rloo
import sft
from common import ConfigError, TrainingError
from conftest import LOGGED_KEY, ROOT, logged, start_run, wait_for

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
    "sft.py": dict(
        train_batch_size=8, samples_per_problem=2, num_generations_eval=1, max_steps=2, eval_steps=0, logging_steps=1
    ),
    "reward_model.py": dict(train_batch_size=8, pairs_per_problem=1, max_steps=2, eval_steps=0, logging_steps=1),
}
NOISE = ("Removed shared tensor", "Writing model shards", "LOAD REPORT")


def every(scripts, *values, fast=("rloo.py",)):
    """pytest params (script, *values), one per script; those not in `fast` are marked slow."""
    return [pytest.param(script, *values, marks=() if script in fast else pytest.mark.slow) for script in scripts]


def run_tiny(script: str, out, **overrides):
    """The script's TINY run in this process, writing to `out`."""
    module = SCRIPTS[script]
    module.main(module.Args(output_dir=str(out), **{**TINY[script], **overrides}))


def tiny_flags(script: str, **overrides) -> list[str]:
    """The script's TINY run as command-line flags."""
    return [text for name, value in {**TINY[script], **overrides}.items() for text in (f"--{name}", str(value))]


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


@pytest.mark.parametrize(
    "script, second",
    [*every(SCRIPTS, signal.SIGINT), pytest.param("rloo.py", signal.SIGTERM, marks=pytest.mark.slow)],
)
def test_a_second_signal_while_the_checkpoint_is_written_does_not_destroy_it(tmp_path, script, second):
    out, flag = tmp_path / "out", tmp_path / "saving"
    process = start_run(script, out, slow=("checkpoint", flag))
    wait_for(logged(out, LOGGED_KEY[script]), process)
    process.send_signal(signal.SIGINT)
    wait_for(flag.exists, process)  # the checkpoint is being written (slowly)
    process.send_signal(second)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + second, stderr  # stopped at once, but only after the write
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1].startswith("stopped at once by ")
    checkpoint = common.resolve_checkpoint("latest", str(out))
    assert torch.load(checkpoint / "training_state.pt", weights_only=False)["step"] == max(
        r["step"] for r in common.read_metrics(out)
    )
    assert not list(out.glob(".checkpoint-*")) and not (out / common.LOCK_FILE).exists()


@pytest.mark.parametrize("script", every(SCRIPTS))
def test_lora_with_gradient_checkpointing_warns_nothing(tmp_path, script):
    """transformers 5 deprecated the names `gradient_checkpointing_enable` (which the scripts no longer call) and
    `is_gradient_checkpointing` (which peft reads in get_peft_model): neither FutureWarning reaches the user."""
    flags = tiny_flags(script, max_steps=1, use_peft=True, gradient_checkpointing=True, eval_strategy="no")
    run = subprocess.run(
        [sys.executable, str(ROOT / script), *flags, "--output_dir", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert "Warning" not in run.stderr, run.stderr


@pytest.mark.parametrize(
    "script, signum",
    [pytest.param("rloo.py", signal.SIGINT, marks=pytest.mark.slow), *every(SAMPLING, signal.SIGTERM)],
)
def test_a_stop_during_the_final_evaluation_keeps_the_trained_model(tmp_path, script, signum):
    """Outside the training loop a signal stops at once, SIGTERM as Ctrl-C: one line saying what was kept, exit status
    128 + its number, the lock released. The final model is saved before the final evaluation."""
    from transformers import AutoModelForCausalLM

    out, flag = tmp_path / "out", tmp_path / "evaluating"
    process = start_run(script, out, "--max_steps", "2", "--num_generations_eval", "1", slow=("final_evaluation", flag))
    wait_for(flag.exists, process)
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signum, stderr
    name = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
    assert stderr.strip().splitlines()[-1] == (
        f"stopped at once by {name}: the trained model is saved in {out}; only the final evaluation is lost"
    )
    assert "Traceback" not in stderr and not (out / common.LOCK_FILE).exists()
    assert AutoModelForCausalLM.from_pretrained(out) is not None  # the model of step 2, saved before the evaluation


def test_sigterm_during_the_first_evaluation_is_one_line_and_releases_the_folder(tmp_path):
    out, flag = tmp_path / "out", tmp_path / "evaluating"
    process = start_run("rloo.py", out, "--num_generations_eval", "1", slow=("first_evaluation", flag))
    wait_for(flag.exists, process)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr
    assert stderr.strip().splitlines()[-1].startswith("stopped at once by SIGTERM: the checkpoints in ")
    assert "Traceback" not in stderr and not (out / common.LOCK_FILE).exists()


@pytest.mark.parametrize("script", every(SCRIPTS))
def test_latest_resumes_the_newest_complete_checkpoint(tmp_path, capsys, script):
    """checkpoint-best, a half-copied checkpoint-99, a truncated training_state.pt, a leftover temporary folder and a
    torn last metrics line are all skipped, each said in a line of its own; the run resumes from checkpoint-2."""
    out = tmp_path / "out"
    run_tiny(script, out, save_steps=1)
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
    said = capsys.readouterr().out.splitlines()
    assert [line.split(" (")[0] for line in said] == [
        "--resume_from_checkpoint: dropping 1 line(s) of metrics.jsonl that do not parse",
        "--resume_from_checkpoint latest: checkpoint-2, skipping .checkpoint-70.tmp",
        "--resume_from_checkpoint latest: checkpoint-2, skipping checkpoint-best",
        "--resume_from_checkpoint latest: checkpoint-2, skipping checkpoint-99",
        "--resume_from_checkpoint latest: checkpoint-2, skipping checkpoint-50",
    ]
    assert said[1].endswith("(a write that did not finish)") and "(not named checkpoint-N" in said[2]
    assert "(accelerator_state/optimizer.bin has 100 of" in said[3] and "(training_state.pt does not load" in said[4]
    run_tiny(script, out, resume_from_checkpoint="latest", max_steps=3)
    assert [r["step"] for r in common.read_metrics(out) if LOGGED_KEY[script] in r] == [1, 2, 3]


FULL_DISK = {  # what each writer raises on a full disk, as seen on a 25 MB tmpfs
    "OSError": OSError(errno.ENOSPC, "No space left on device"),
    "torch": RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 6114688 vs 6114576"),
    "safetensors": SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
}


@pytest.mark.parametrize(
    "script, writer",
    [*every(SCRIPTS, "torch"), ("rloo.py", "safetensors"), pytest.param("rloo.py", "OSError", marks=pytest.mark.slow)],
)
def test_a_full_disk_keeps_the_previous_checkpoint(tmp_path, monkeypatch, capsys, script, writer):
    """torch.save (accelerate's optimizer.bin) raises RuntimeError, safetensors (the model) its own error, Python's own
    writes OSError: each is one line naming the checkpoint and the error, exit status 2; the earlier checkpoint is kept
    and no temporary folder is left to fill the disk (or make the next run refuse the folder)."""
    out = tmp_path / "out"
    torch_save, safetensors_save = torch.save, modeling_utils.safe_save_file

    def fail(real):
        def write(obj, path, *args, **kwargs):
            if ".checkpoint-2.tmp" in str(path) and (real is safetensors_save) == (writer == "safetensors"):
                raise FULL_DISK[writer]
            return real(obj, path, *args, **kwargs)

        return write

    monkeypatch.setattr(torch, "save", fail(torch_save))
    monkeypatch.setattr(modeling_utils, "safe_save_file", fail(safetensors_save))
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=2**20))  # 1 MB left
    line = cli_error(script, [*tiny_flags(script, max_steps=3, save_steps=1), "--output_dir", str(out)], capsys)
    reason = (
        "No space left on device"
        if writer == "OSError"
        else f"{type(FULL_DISK[writer]).__name__}: {FULL_DISK[writer]}; the disk may be full: 1.0 MB free"
    )
    assert (
        line == f"error: --output_dir: cannot write {out / 'checkpoint-2'} ({reason}); the earlier checkpoints are kept"
    )
    assert common.checkpoint_problem(out / "checkpoint-1") is None
    assert not (out / "checkpoint-2").exists() and not list(out.glob(".checkpoint-*"))
    assert not (out / common.LOCK_FILE).exists()


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
        run_tiny(script, out, reward_funcs=f"{module}:flaky", eval_strategy="no")  # calls counted from the first step
    assert common.checkpoint_problem(out / "checkpoint-1") is None


@pytest.mark.parametrize("returned", ["0.5", "None"])
@pytest.mark.parametrize("script", every(RL))
def test_a_reward_function_must_return_a_list(tmp_path, script, returned):
    module = tmp_path / "scalar.py"
    module.write_text(f"def scalar(completions, **kwargs):\n    return {returned}\n")
    with pytest.raises(
        TrainingError, match=f"reward function scalar: returned {returned}, not a list with one value per completion"
    ):
        run_tiny(script, tmp_path / "out", reward_funcs=f"{module}:scalar")


@pytest.mark.parametrize("script", every(RL))
def test_the_error_line_starts_on_a_line_of_its_own(tmp_path, script):
    """Not after the progress bar (tqdm ends its lines with a carriage return only)."""
    module = tmp_path / "flaky.py"
    module.write_text(
        "calls = []\n\ndef flaky(completions, **kwargs):\n    calls.append(1)\n    if len(calls) == 3:\n"
        "        raise ValueError('boom')\n    return [1.0] * len(completions)\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / script),
            *tiny_flags(script, max_steps=5, logging_steps=10, eval_strategy="no"),  # calls counted from step 1
            "--output_dir",
            str(tmp_path / "out"),
            "--reward_funcs",
            f"{module}:flaky",
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
@pytest.mark.parametrize("script", every(SCRIPTS))
def test_a_fresh_run_into_another_runs_folder_stops_unless_asked_to_continue_or_start_over(tmp_path, script):
    out = tmp_path / "out"
    run_tiny(script, out, max_steps=1, save_steps=1)
    before = (out / "metrics.jsonl").read_text()
    with pytest.raises(
        ConfigError,
        match="--output_dir: .* holds another run \\(checkpoint-1, metrics.jsonl\\): continue it with "
        "--resume_from_checkpoint latest, start over with --overwrite_output_dir",
    ):
        run_tiny(script, out, max_steps=1, save_steps=1)
    assert (out / "metrics.jsonl").read_text() == before
    run_tiny(script, out, resume_from_checkpoint="latest", max_steps=2, save_steps=1)
    assert [r["step"] for r in common.read_metrics(out) if LOGGED_KEY[script] in r] == [1, 2]
    run_tiny(script, out, overwrite_output_dir=True, max_steps=1, save_steps=0)
    assert [r["step"] for r in common.read_metrics(out) if LOGGED_KEY[script] in r] == [1]
    assert not list(out.glob("checkpoint-*"))


def hold_lock(out, host=None, lease_duration=common.LOCK_STALE_S) -> subprocess.Popen:
    """Another run holding out's lock: a process that takes it (on `host`, if given), says so, and sleeps."""
    code = (
        "import socket, sys, time, filelock\n"
        f"if {host!r}: socket.gethostname = lambda: {host!r}\n"
        f"lease = filelock.SoftFileLease(sys.argv[1], lease_duration={lease_duration})\n"
        "lease.acquire()\nprint('held', flush=True)\ntime.sleep(60)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(out / common.LOCK_FILE)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline() == "held\n"
    return holder


@pytest.mark.parametrize("script", every(SCRIPTS))
def test_a_live_runs_lock_stops_a_second_run_and_a_dead_runs_lock_does_not(tmp_path, capsys, script):
    out = tmp_path / "out"
    out.mkdir()
    other = hold_lock(out)
    try:
        with pytest.raises(ConfigError, match=f"--output_dir: .* is in use by another run \\(pid {other.pid} on "):
            run_tiny(script, out)
        assert sorted(p.name for p in out.iterdir()) == [common.LOCK_FILE]  # nothing written
    finally:
        other.kill()
        other.wait()
    capsys.readouterr()
    run_tiny(script, out)  # a crashed run's lock is stale
    assert f"took over the lock of pid {other.pid} on " in capsys.readouterr().out


def test_another_hosts_lock_is_taken_over_once_its_heartbeat_stops(tmp_path, capsys, monkeypatch):
    """A run on another node (a Slurm requeue, a preempted pod) cannot be asked whether it lives: this run waits
    LOCK_STALE_S for its heartbeat. A live one keeps refreshing its lock and the run stops with one line naming it; a
    dead one's lock is taken over."""
    monkeypatch.setattr(common, "LOCK_STALE_S", 1.0)
    other = hold_lock(tmp_path, host="node-17", lease_duration=1.0)
    try:
        assert common.take_lock(tmp_path) == (
            f"--output_dir: {tmp_path} is in use by another run (pid {other.pid} on node-17): wait for it or choose "
            "another folder"
        )
        waiting = (
            f"--output_dir: {tmp_path} is locked by pid {other.pid} on node-17: waiting 1 s for its heartbeat to stop"
        )
        assert waiting in capsys.readouterr().out
    finally:
        other.kill()
        other.wait()
    assert common.take_lock(tmp_path) is None
    assert f"took over the lock of pid {other.pid} on node-17, whose run is gone" in capsys.readouterr().out
    assert f"pid={os.getpid()}" in (tmp_path / common.LOCK_FILE).read_text()
    common.release_output_dir(tmp_path)
    assert not (tmp_path / common.LOCK_FILE).exists()


def test_a_running_runs_lock_has_a_heartbeat(tmp_path, monkeypatch):
    """The run refreshes its lock every LOCK_STALE_S / 3 seconds; the lock goes when the run releases it."""
    monkeypatch.setattr(common, "LOCK_STALE_S", 0.3)
    assert common.take_lock(tmp_path) is None
    lock = tmp_path / common.LOCK_FILE
    os.utime(lock, (0, 0))
    time.sleep(0.5)
    assert time.time() - lock.stat().st_mtime < 5
    common.release_output_dir(str(tmp_path))
    assert not lock.exists()


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
    (SCRIPTS, ["--report_to", "wandb,tensorbord"], "error: --report_to: unknown tracker 'tensorbord'"),
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
        "error: --dataset_name: the dataset has no 'solution' or 'ground_truth' column, one of which reward function "
        "accuracy_reward needs"
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

    assert required_columns(format_reward) == required_columns(accuracy_reward) == []
    assert accuracy_reward.one_of_columns == ("solution", "ground_truth")  # it reads whichever the dataset has
    assert required_columns(mine) == ["answer", "unit"]


def test_sft_says_how_many_training_sequences_it_cuts(tiny_tokenizer, capsys):
    """A prompt and completion longer than --max_length are cut to its first tokens: one warning, before training."""
    from datasets import Dataset

    dataset = Dataset.from_list([{"prompt": "1 + 1 =", "completion": " 2" * n} for n in (1, 40, 2, 60)])
    rows = sft.tokenize(tiny_tokenizer, dataset, max_length=24)
    assert [len(row["input_ids"]) for row in rows][1::2] == [24, 24]
    assert capsys.readouterr().out == (
        "warning: --max_length 24: cut 2 of 4 training sequences to their first 24 tokens (the rest of each "
        "completion, its EOS included, is not trained on)\n"
    )
