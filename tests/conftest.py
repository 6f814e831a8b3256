import os
import sys
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
