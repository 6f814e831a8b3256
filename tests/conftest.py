import os
import signal
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if "PYTEST_XDIST_WORKER" in os.environ:  # under `pytest -n`: one thread per worker and per run it starts, so the
    os.environ["OMP_NUM_THREADS"] = "1"  # workers share the cores instead of each taking all of them
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402
import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402

import common  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """Each script's main() makes an Accelerator, and accelerate keeps its state per process (a run is a process);
    the tests run many mains in one process, some with --bf16, so the state is reset after each test."""
    yield
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture(scope="session")
def tiny_model():
    return common.load_causal_lm(common.EMBEDDED_MODEL)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return common.load_tokenizer(common.EMBEDDED_MODEL)


@pytest.fixture
def recorded_gradients(monkeypatch) -> list:
    """The accumulated gradient of every optimizer step, recorded just before clipping (Adam-updated weights would blur
    comparisons: its first step is nearly a sign step). The scripts clip with accelerate's clip_grad_norm_ (ppo.py's
    value model with torch's, which some accelerate releases also call: recorded once)."""
    gradients, inside_accelerate = [], []
    accelerate_clip, torch_clip = Accelerator.clip_grad_norm_, torch.nn.utils.clip_grad_norm_

    def record(params):
        params = [p for p in params if p.grad is not None]
        if not inside_accelerate:
            gradients.append(torch.cat([p.grad.flatten() for p in params]))
        return params

    def accelerator_record_then_clip(self, params, max_norm, **kwargs):
        params = record(params)
        inside_accelerate.append(True)
        try:
            return accelerate_clip(self, params, max_norm, **kwargs)
        finally:
            inside_accelerate.pop()

    monkeypatch.setattr(Accelerator, "clip_grad_norm_", accelerator_record_then_clip)
    monkeypatch.setattr(
        torch.nn.utils, "clip_grad_norm_", lambda params, *a, **kw: torch_clip(record(params), *a, **kw)
    )
    return gradients


# A small run of each script (seconds), and the metric its training records log, for the tests that run it as a
# subprocess and send it signals.
TINY_RUN = {
    "rloo.py": ["--prompts_per_step", "4"],
    "grpo.py": ["--prompts_per_step", "4", "--num_generations", "4"],
    "reinforce.py": ["--prompts_per_step", "4"],
    "ppo.py": ["--prompts_per_step", "4", "--num_ppo_epochs", "1"],
    "sft.py": ["--train_batch_size", "8", "--samples_per_problem", "2", "--num_generations_eval", "1"],
    "reward_model.py": ["--train_batch_size", "8", "--pairs_per_problem", "1"],
}
LOGGED_KEY = {
    "rloo.py": "reward",
    "grpo.py": "reward",
    "reinforce.py": "reward",
    "ppo.py": "objective/scores",
    "sft.py": "loss",
    "reward_model.py": "loss",
}


def start_run(script: str, out: Path, *flags: str, slow: tuple[str, Path] | None = None) -> subprocess.Popen:
    """`script` for 1000 steps as a subprocess, writing to `out`; `slow=(part, flag_file)` runs it through
    tests/slow_parts.py, which slows that part down and touches flag_file when it begins."""
    command = [
        str(ROOT / script),
        "--output_dir",
        str(out),
        "--max_steps",
        "1000",
        "--eval_steps",
        "0",
        "--logging_steps",
        "1",
        "--save_steps",
        "0",
        *TINY_RUN[script],
        *flags,
    ]
    if slow is not None:
        command = [str(ROOT / "tests" / "slow_parts.py"), slow[0], str(slow[1]), *command]
    return subprocess.Popen(
        [sys.executable, *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        # a pytest started in the background (`cmd &`, nohup) passes SIGINT on as ignored, and Python then never
        # turns it into KeyboardInterrupt: the run gets Ctrl-C's default, whatever started the tests
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def wait_for(condition, process: subprocess.Popen, timeout: float = 120):
    """Poll `condition()` until it holds; fail with the run's output if the run ends first or time runs out."""
    deadline = time.time() + timeout
    while not condition():
        if process.poll() is not None or time.time() > deadline:
            process.kill()
            stdout, stderr = process.communicate()
            pytest.fail(f"the run ended (status {process.returncode}) or timed out first:\n{stdout}\n{stderr}")
        time.sleep(0.2)


def logged(out: Path, key: str):
    """A condition: `key` is in out/metrics.jsonl."""
    return lambda: (out / "metrics.jsonl").exists() and f'"{key}"' in (out / "metrics.jsonl").read_text()


@pytest.fixture
def interrupt_run():
    """Start `script` for 1000 steps, send `signum` (Ctrl-C's SIGINT unless said) once `logged_key` is in its metrics,
    and check the clean exit: status 128 + signum, no traceback, one checkpoint at the last logged step. Returns the
    checkpoint folder; the run's stderr is left in `interrupt_run.stderr`."""

    def run(script: str, out: Path, logged_key: str | None = None, signum: int = signal.SIGINT) -> Path:
        process = start_run(script, out)
        wait_for(logged(out, logged_key or LOGGED_KEY[script]), process)
        process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=120)
        assert process.returncode == 128 + signum, stderr
        assert "Traceback" not in stderr and "interrupted at step" in stdout
        (checkpoint,) = out.glob("checkpoint-*")
        assert int(checkpoint.name.split("-")[1]) == max(r["step"] for r in common.read_metrics(out))
        run.stderr = stderr
        return checkpoint

    return run


@pytest.fixture(scope="session")
def hub_model(tmp_path_factory) -> str:
    """A hub-like checkpoint folder made here (tests/hub_like.py): Llama, its own tokenizer with no pad token, a chat
    template with a system turn, attention dropout, and a generation_config.json that sets what chat models ship."""
    from hub_like import make_hub_like_checkpoint

    return str(make_hub_like_checkpoint(tmp_path_factory.mktemp("hub-like")))
