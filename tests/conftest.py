import os
import signal
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402
import torch  # noqa: E402

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
    comparisons: its first step is nearly a sign step). accelerate's clip_grad_norm_ calls torch's."""
    gradients = []
    clip = torch.nn.utils.clip_grad_norm_

    def record_then_clip(params, max_norm, **kwargs):
        params = [p for p in params if p.grad is not None]
        gradients.append(torch.cat([p.grad.flatten() for p in params]))
        return clip(params, max_norm, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", record_then_clip)
    return gradients


@pytest.fixture
def interrupt_run():
    """Start `script` for 1000 steps, press Ctrl-C once `logged_key` is in its metrics, and check the clean exit: status
    130, no traceback, one checkpoint at the last logged step. Returns the checkpoint folder."""

    def run(script: str, out: Path, logged_key: str) -> Path:
        command = [sys.executable, str(ROOT / script), "--output_dir", str(out), "--max_steps", "1000", "--eval_steps", "0",
                   "--logging_steps", "1", "--prompts_per_step", "4", "--save_steps", "0"]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        deadline = time.time() + 120
        while time.time() < deadline and not ((out / "metrics.jsonl").exists() and f'"{logged_key}"' in (out / "metrics.jsonl").read_text()):
            time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=120)
        assert process.returncode == 130, stderr
        assert "Traceback" not in stderr and "interrupted at step" in stdout
        (checkpoint,) = out.glob("checkpoint-*")
        assert int(checkpoint.name.split("-")[1]) == max(r["step"] for r in common.read_metrics(out))
        return checkpoint

    return run


@pytest.fixture(scope="session")
def hub_model(tmp_path_factory) -> str:
    """A hub-like checkpoint folder made here (tests/hub_like.py): Llama, its own tokenizer with no pad token, a chat
    template with a system turn, attention dropout, and a generation_config.json that sets what chat models ship."""
    from hub_like import make_hub_like_checkpoint

    return str(make_hub_like_checkpoint(tmp_path_factory.mktemp("hub-like")))
