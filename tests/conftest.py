import os
import signal
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# under `pytest -n`: one thread per worker and per run it starts
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ["OMP_NUM_THREADS"] = "1"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402
import torch  # noqa: E402

EMBEDDED = str(ROOT / "models" / "tiny-arith")
ARITHMETIC = str(ROOT / "data" / "arithmetic")


@pytest.fixture(autouse=True)
def _seed_and_fresh_accelerate_state():
    """Each main() makes an Accelerator, and accelerate keeps its state per process; the tests run many mains in one
    process, some with --bf16, so the state is reset after each test."""
    torch.manual_seed(0)
    yield
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def run_main(module, *flags, monkeypatch=None):
    """`module.main` with the command line `flags`, in this process (no interpreter start): as `python script.py`."""
    argv = [f"{module.__name__}.py", *map(str, flags)]
    old, sys.argv = sys.argv, argv
    try:
        module.main(module.parse_args(module.Args))
    finally:
        sys.argv = old


def run_script(script: str, *flags, cwd=ROOT, timeout=600) -> subprocess.CompletedProcess:
    """`python script flags` in a child process; returns it with its stdout and stderr."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    command = [sys.executable, str(script), *map(str, flags)]
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def stop_script(script: str, *flags, output_dir: Path, signum: int, once='"step"'):
    """`python script flags --output_dir output_dir` in a child process, sent `signum` as soon as its metrics.jsonl
    holds `once` (a step logged); returns its exit status, stdout and stderr. Ctrl-C (SIGINT) stops the child as a
    terminal's would."""
    command = [
        sys.executable,
        str(ROOT / script),
        *map(str, flags),
        "--output_dir",
        str(output_dir),
    ]
    metrics = output_dir / "metrics.jsonl"
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + 240
    while once not in (metrics.read_text() if metrics.exists() else ""):
        assert process.poll() is None, process.communicate()
        assert time.time() < deadline
        time.sleep(0.1)
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=240)
    return process.returncode, stdout, stderr


def error_line(result: subprocess.CompletedProcess) -> str:
    """The one `error: ...` line of a run that stopped on bad input (exit status 2, no traceback); libraries may log
    other lines (bitsandbytes on some CPUs), which are not the script's."""
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr[-3000:]
    return errors[0]


def run_to_its_stop(module, *flags, capsys) -> tuple[int, list[str]]:
    """Run as `python script.py flags` is (its __main__ block, in this process), to a stop: its exit
    status and the lines it wrote to stderr."""
    from rewards import RewardError

    with pytest.raises(SystemExit) as stopped:
        try:
            run_main(module, *flags)
        except (module.BadInput, RewardError) as error:
            module.fail(str(error))
    return stopped.value.code, capsys.readouterr().err.splitlines()


def one_line_error(module, *flags, capsys) -> str:
    """The line a script prints when `flags` are bad input: `error: ...` on stderr, exit status 2."""
    status, lines = run_to_its_stop(module, *flags, capsys=capsys)
    assert status == 2
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1, errors
    return errors[0]


def read_metrics(output_dir) -> list[dict]:
    import json

    return [
        json.loads(line) for line in (Path(output_dir) / "metrics.jsonl").read_text().splitlines()
    ]


@pytest.fixture(scope="session")
def tiny_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(EMBEDDED)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    import common

    return common.load_tokenizer(EMBEDDED)


@pytest.fixture
def recorded_gradients(monkeypatch) -> list:
    """The accumulated gradient of every clipped model (ppo.py: the policy, then the value model), just before it is
    clipped."""
    from accelerate import Accelerator

    gradients, clip = [], Accelerator.clip_grad_norm_

    def record_then_clip(self, parameters, max_norm, **kwargs):
        parameters = [p for p in parameters if p.grad is not None]
        gradients.append(torch.cat([p.grad.flatten() for p in parameters]))
        return clip(self, parameters, max_norm, **kwargs)

    monkeypatch.setattr(Accelerator, "clip_grad_norm_", record_then_clip)
    return gradients
