"""Mistakes handled by cause (issue 20): training that is no longer finite, what the run writes while it runs, and the
lock on its output folder. Each cause is tested with cases of its own, in every script it reaches.

- Not finite: the run stops at that step with one line naming the step and what went non-finite, saves nothing of it
  (no checkpoint, no final model: the newest checkpoint stays `latest`) and exits 2; under several processes every
  process stops at the same step. A NaN reward is not a failure: it marks an unscorable completion.
- Writes: the final model (its merged copy, ppo's value model) and metrics.jsonl are written whole or not at all; a
  write that fails is one line that says what is kept.
- The lock: a lock file that names no run (torn) is taken over once it stays unchanged; of runs starting together or
  taking over one stale lock together, one gets the folder.

rloo.py's cases run in the fast subset; the other scripts' are marked slow.
"""

import errno
import multiprocessing
import os
import re
import resource
import signal
import subprocess
import sys

import pytest
import torch
from safetensors import SafetensorError
from test_distributed import free_port
from test_faults import RL, SCRIPTS, cli_error, every, run_tiny, tiny_flags
from transformers import modeling_utils

import common
from conftest import ROOT


def no_model_in(out) -> bool:
    """Nothing of a final model in `out`: no config, no weights, no adapter, no merged or value model, no temporary
    folder."""
    names = {path.name for path in out.iterdir()}
    return not names & {
        "config.json",
        "adapter_config.json",
        "model.safetensors",
        "merged",
        "value_model",
        ".final.tmp",
    }


# ----------------------------------------------------------------------------------------------------------------------
# Training that is no longer finite
# ----------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def nan_model(tmp_path_factory, tiny_model, tiny_tokenizer) -> str:
    """The embedded model with one NaN in its final norm: every hidden state, logit and score is NaN (weights that
    diverged in an earlier run, or a corrupted download)."""
    folder = tmp_path_factory.mktemp("nan-model")
    model = type(tiny_model).from_pretrained(common.EMBEDDED_MODEL)
    with torch.no_grad():
        model.model.norm.weight[0] = float("nan")
    model.save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    return str(folder)


WHAT_IS_NOT_FINITE = {  # at step 1 of the NaN model
    "rloo.py": "loss, grad norm",
    "grpo.py": "loss, grad norm",
    "reinforce.py": "loss, grad norm",
    "ppo.py": "policy loss, value loss, grad norm, value grad norm",
    "sft.py": "loss, grad norm",
    "reward_model.py": "score, loss, grad norm",
}


@pytest.mark.parametrize("script", every(SCRIPTS))
def test_weights_that_are_not_finite_stop_the_run_at_its_first_step(tmp_path, capsys, nan_model, script):
    """The RL scripts sample from the NaN policy without crashing in torch.multinomial (a non-finite row of logits is
    sampled uniformly); the step's loss and gradient are then NaN and the run stops before its first update."""
    out = tmp_path / "out"
    flags = tiny_flags(script, save_steps=1, eval_strategy="no")
    line = cli_error(script, [*flags, "--model_name_or_path", nan_model, "--output_dir", str(out)], capsys)
    assert line == (
        f"error: step 1: not finite: {WHAT_IS_NOT_FINITE[script]} (training diverged: too high a --learning_rate?); "
        f"the weights of this step are not saved; no checkpoint was saved in {out} (--save_steps)"
    )
    assert not list(out.glob("*checkpoint-*")) and no_model_in(out)
    assert not (out / common.LOCK_FILE).exists()


OVERFLOW = """calls = []

def big(completions, **kwargs):
    calls.append(1)
    return [3e38 if len(calls) >= 3 else 1.0] * len(completions)  # float32's largest is 3.4e38


def also_big(completions, **kwargs):
    return big(completions)
"""


@pytest.mark.parametrize("script", every(RL))
def test_rewards_whose_sum_overflows_stop_the_run_and_keep_the_last_checkpoint(tmp_path, capsys, script):
    """Two reward functions return 3e38 each from step 3 on: finite numbers, whose weighted sum is inf in float32. The
    run stops at step 3 naming the reward; checkpoint-2 stays the newest, and nothing of step 3 is written."""
    module = tmp_path / "overflow.py"
    module.write_text(OVERFLOW)
    out = tmp_path / "out"
    # no evaluation: `big` counts its calls from the first training step
    flags = [*tiny_flags(script, max_steps=5, save_steps=1, eval_strategy="no"), "--reward_funcs", f"{module}:big"]
    line = cli_error(script, [*flags, f"{module}:also_big", "--output_dir", str(out)], capsys)
    reward = "score" if script == "ppo.py" else "reward"
    assert line.startswith(f"error: step 3: not finite: {reward}")
    assert line.endswith(f"the newest checkpoint, {out / 'checkpoint-2'}, is kept (--resume_from_checkpoint latest)")
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    assert common.resolve_checkpoint("latest", str(out)) == out / "checkpoint-2"
    assert no_model_in(out)
    assert max(r["step"] for r in common.read_metrics(out)) == 2


@pytest.mark.slow
def test_every_process_stops_at_the_same_step(tmp_path):
    """Only process 1's rewards overflow: both processes stop at step 1, before its update, process 1 naming the
    reward and process 0 saying that it went non-finite on another process, and the launch fails."""
    module = tmp_path / "rank_overflow.py"
    module.write_text(
        "import os\n\ndef big(completions, **kwargs):\n"
        "    return [3e38 if os.environ['RANK'] == '1' else 1.0] * len(completions)\n\n"
        "def also_big(completions, **kwargs):\n    return big(completions)\n"
    )
    out = tmp_path / "out"
    reward_funcs = f"{module}:big,{module}:also_big"
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    command += ["--main_process_port", free_port(), "--num_machines", "1", "--mixed_precision", "no"]
    command += ["--dynamo_backend", "no", str(ROOT / "rloo.py"), *tiny_flags("rloo.py", max_steps=3)]
    command += ["--reward_funcs", reward_funcs, "--eval_strategy", "no", "--output_dir", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "ACCELERATE_USE_CPU": "1"}
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    # the two processes' lines, each after whatever of the other's progress bar shares stderr
    lines = re.findall(r"error: step \d+: not finite: .*", result.stderr)
    assert sorted(lines) == [
        f"error: step 1: not finite: {what} (training diverged: too high a --learning_rate?); the weights of this "
        f"step are not saved; no checkpoint was saved in {out} (--save_steps)"
        for what in ("a value on another process", "reward")
    ], result.stderr[-3000:]
    assert no_model_in(out) and not (out / common.LOCK_FILE).exists()


# ----------------------------------------------------------------------------------------------------------------------
# What the run writes while it runs
# ----------------------------------------------------------------------------------------------------------------------
def limited_file_size(limit: int):
    """For a subprocess: no file it writes may grow past `limit` bytes, as if the disk filled up (writes fail with
    EFBIG; the write that crosses the limit is cut short)."""

    def preexec():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the process is killed instead of the write failing
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


@pytest.mark.parametrize("script", every(SCRIPTS))
def test_a_disk_that_fills_while_metrics_are_logged_leaves_no_torn_line(tmp_path, script):
    """metrics.jsonl reaches the limit after a few steps: the record that does not fit is cut back off (no torn line
    for the next one to be glued to), and the run stops with one line; the checkpoint it then tries does not fit
    either and says so."""
    out = tmp_path / "out"
    limit = 4000
    command = [sys.executable, str(ROOT / script), *tiny_flags(script, max_steps=200), "--output_dir", str(out)]
    result = subprocess.run(
        [*command, "--eval_strategy", "no"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
        preexec_fn=limited_file_size(limit),
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: --output_dir: cannot write ")
    text = (out / "metrics.jsonl").read_text()
    lines = text.splitlines()
    assert text.endswith("\n") and len(lines) >= 2
    assert len(common.read_metrics(out)) == len(lines)  # every line parses
    assert 0 < limit - len(text) < len(lines[-1]) + 200  # the run got as far as the limit: the next record did not fit
    assert no_model_in(out) and not list(out.glob("*checkpoint-*"))


@pytest.mark.parametrize("script", every(SCRIPTS))
def test_a_full_disk_at_the_merged_model_leaves_no_half_model(tmp_path, monkeypatch, capsys, script):
    """With --use_peft --save_merged_model the final save writes the adapter, then the merged full model. The disk
    fills during the merged model: output_dir gets neither (no adapter without the merged model it was asked for),
    and the line names the newest checkpoint, kept."""
    out = tmp_path / "out"
    safetensors_save = modeling_utils.safe_save_file

    def fail_in_merged(obj, path, *args, **kwargs):
        if "merged" in str(path):
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        return safetensors_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(modeling_utils, "safe_save_file", fail_in_merged)
    flags = [*tiny_flags(script, save_steps=1, eval_strategy="no"), "--use_peft", "True", "--save_merged_model", "True"]
    line = cli_error(script, [*flags, "--output_dir", str(out)], capsys)
    assert line.startswith(
        f"error: --output_dir: cannot write the final model to {out} (SafetensorError: Error while serializing"
    )
    assert line.endswith(f"the newest checkpoint, {out / 'checkpoint-2'}, is kept (--resume_from_checkpoint latest)")
    assert no_model_in(out) and common.checkpoint_problem(out / "checkpoint-2") is None
    assert not (out / common.LOCK_FILE).exists()


def test_a_full_disk_at_ppos_value_model_leaves_no_half_model(tmp_path, monkeypatch, capsys):
    """ppo.py's final save is the policy and its value model: when the value model does not fit, neither is in
    output_dir (a policy next to no value model, or half of one, would pass for a finished run)."""
    out = tmp_path / "out"
    torch_save, safetensors_save = torch.save, modeling_utils.safe_save_file

    def fail_in_value_model(real):
        def write(obj, path, *args, **kwargs):
            if "value_model" in str(path):
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(obj, path, *args, **kwargs)

        return write

    monkeypatch.setattr(torch, "save", fail_in_value_model(torch_save))
    monkeypatch.setattr(modeling_utils, "safe_save_file", fail_in_value_model(safetensors_save))
    line = cli_error("ppo.py", [*tiny_flags("ppo.py", eval_strategy="no"), "--output_dir", str(out)], capsys)
    assert line == (
        f"error: --output_dir: cannot write the final model to {out} (No space left on device); no checkpoint was "
        f"saved in {out} (--save_steps)"
    )
    assert no_model_in(out)


def test_a_resumed_runs_metrics_survive_a_full_disk(tmp_path, monkeypatch, capsys):
    """A resumed run rewrites metrics.jsonl without the records past its checkpoint. On a full disk, opening a file
    for writing empties it and the write fails: the history is kept whole, and the run stops with one line."""
    out = tmp_path / "out"
    run_tiny("rloo.py", out, max_steps=3, save_steps=2)
    before = (out / "metrics.jsonl").read_text()
    write_text = common.Path.write_text

    def full_disk(path, data, *args, **kwargs):
        if "metrics" in path.name:
            write_text(path, "")  # opened for writing, nothing more fits
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_text(path, data, *args, **kwargs)

    monkeypatch.setattr(common.Path, "write_text", full_disk)
    flags = tiny_flags("rloo.py", max_steps=4, save_steps=2)
    line = cli_error("rloo.py", [*flags, "--resume_from_checkpoint", "latest", "--output_dir", str(out)], capsys)
    assert line == f"error: --output_dir: cannot write {out / 'metrics.jsonl'} (No space left on device)"
    assert (out / "metrics.jsonl").read_text() == before
    assert not list(out.glob(".metrics*")) and not (out / common.LOCK_FILE).exists()


# ----------------------------------------------------------------------------------------------------------------------
# The output folder's lock
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("script", every(SCRIPTS))
def test_a_torn_lock_is_taken_over_once_it_stays_unchanged(tmp_path, capsys, script):
    """A lock that does not parse (a crash while it was written, or a run writing it right now) names no run that can
    be asked whether it lives: the run waits until it has stayed unchanged for a moment, then takes it over."""
    out = tmp_path / "out"
    out.mkdir()
    (out / common.LOCK_FILE).write_text('{"pid": 12')
    run_tiny(script, out)
    assert f"--output_dir: {out} is locked by a run its lock does not name: waiting" in capsys.readouterr().out


def start_together(out, barrier, results, done):
    """One of the runs of the race below: wait for the others, claim `out`, and live until every run has decided."""
    barrier.wait()
    results.put(common.take_lock(out))
    done.wait()


@pytest.mark.parametrize("crashed_run", [False, True], ids=["free", "a crashed run's lock"])
def test_of_runs_starting_together_one_gets_the_folder(tmp_path, monkeypatch, crashed_run):
    """Four runs claim one folder at the same moment, free or holding a crashed run's lock that each of them would
    take over: exactly one run gets the folder, and the others name it."""
    monkeypatch.setattr(common, "LOCK_STALE_S", 5.0)  # a run that found the lock mid-write waits this long at most
    if crashed_run:
        crash = "lease = filelock.SoftFileLease(sys.argv[1], lease_duration=5.0); lease.acquire(); os._exit(0)"
        subprocess.run([sys.executable, "-c", f"import filelock, os, sys; {crash}", tmp_path / common.LOCK_FILE])
        assert (tmp_path / common.LOCK_FILE).exists()
    context = multiprocessing.get_context("fork")
    barrier, results, done = context.Barrier(4), context.Queue(), context.Event()
    runs = [context.Process(target=start_together, args=(tmp_path, barrier, results, done)) for _ in range(4)]
    for run in runs:
        run.start()
    outcomes = [results.get(timeout=60) for _ in runs]
    done.set()
    for run in runs:
        run.join(timeout=60)
    assert outcomes.count(None) == 1, outcomes
    assert all(f"{tmp_path} is in use by another run" in outcome for outcome in outcomes if outcome), outcomes
