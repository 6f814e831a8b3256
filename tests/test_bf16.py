"""--bf16 and the log-prob memory: the bf16 sampler and its weight sync, bf16 frozen models, float32 master weights,
the chunked log-softmax (the same numbers and gradients as one chunk, no float32 copy of the logits kept), and a bf16
run that learns."""

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import common
import rloo


def batch(tokenizer, completion: str = "<answer>12</answer><|im_end|>"):
    texts = [
        "<|im_start|>user\nCompute 3 × 4.<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n",
    ]
    ids = tokenizer(completion, add_special_tokens=False, return_tensors="pt").input_ids
    enc = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    input_ids = torch.cat([enc.input_ids, ids.repeat(2, 1)], 1)
    return input_ids, torch.cat([enc.attention_mask, torch.ones_like(ids).repeat(2, 1)], 1), ids.shape[1]


def test_chunked_log_softmax_equals_one_chunk_in_value_and_gradient(tiny_model, tiny_tokenizer):
    """Chunks of one or a few positions (`chunk`), each recomputed in the backward pass, give the log-probs,
    the entropy and the gradient of a single chunk."""
    input_ids, attention_mask, T = batch(tiny_tokenizer)
    results = []
    for chunk_elements in (2**24, 1, 3 * 2 * tiny_model.config.vocab_size):  # one chunk; one position; three
        tiny_model.zero_grad()
        logprobs, entropy = rloo.completion_logprobs(
            tiny_model, input_ids, attention_mask, T, 0.7, entropy=True, chunk=chunk_elements
        )
        (logprobs * torch.linspace(-1, 1, T)).sum().backward()
        results.append((logprobs.detach(), entropy, torch.cat([p.grad.flatten() for p in tiny_model.parameters()])))
    tiny_model.zero_grad()
    for logprobs, entropy, grad in results[1:]:
        assert torch.allclose(logprobs, results[0][0], atol=1e-6)
        assert torch.allclose(entropy, results[0][1], atol=1e-6)
        assert torch.allclose(grad, results[0][2], atol=1e-6)


def test_no_float32_copy_of_the_logits_is_kept_for_the_backward_pass(tiny_model, tiny_tokenizer):
    """Under bf16 autocast the backward pass keeps the bf16 logits and recomputes their float32 log-softmax per chunk:
    no float32 (B, t, V) tensor is saved. Without autocast the float32 logits are the one copy."""
    input_ids, attention_mask, T = batch(tiny_tokenizer)
    V = tiny_model.config.vocab_size

    def saved_logits(autocast: bool) -> list:
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                rloo.completion_logprobs(tiny_model, input_ids, attention_mask, T, 0.7, entropy=True)
        storages = {t.untyped_storage().data_ptr(): t for t in saved if t.shape[-1] == V and t.dim() == 3}
        return [t.dtype for t in storages.values()]

    assert saved_logits(autocast=True) == [torch.bfloat16]
    assert saved_logits(autocast=False) == [torch.float32]


def bf16_args(**overrides):
    flags = {"bf16": True, "use_vllm": False, "use_peft": False, "model_name_or_path": common.EMBEDDED_MODEL}
    # output_dir and report_to for make_accelerator's trackers (nothing is written until a MetricsLogger starts them),
    # the rest for loading_options
    return SimpleNamespace(
        **{
            **flags,
            "output_dir": "unused",
            "model_revision": "main",
            "trust_remote_code": False,
            "attn_implementation": None,
            "report_to": "none",
            **overrides,
        }
    )


def test_bf16_sampler_is_a_bf16_copy_refreshed_from_the_policy_before_each_generation():
    accelerator = common.make_accelerator(bf16_args())
    policy = common.load_causal_lm(common.EMBEDDED_MODEL, dtype=torch.float32)
    sampler = common.bf16_sampler(accelerator, policy, bf16_args())
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in sampler.parameters())
    with torch.no_grad():  # an update: the sampler must not sample from the old weights
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    with common.generation_model(accelerator, policy, sampler) as model:
        assert model is sampler
        for copy, weight in zip(sampler.parameters(), policy.parameters(), strict=True):
            assert torch.equal(copy, weight.to(torch.bfloat16))
    assert next(policy.parameters()).dtype == torch.float32  # the master weights stay float32
    for no_copy in (dict(bf16=False), dict(use_peft=True), dict(use_vllm=True)):
        assert common.bf16_sampler(accelerator, policy, bf16_args(**no_copy)) is None


def test_bf16_run_loads_fp32_master_weights_and_bf16_frozen_models(tmp_path, monkeypatch):
    """--bf16: the trained policy in float32 (even from a bf16 checkpoint), the reference and the sampler in bf16,
    each loaded once; the loss, log-probs and KL are finite and the update is not zero."""
    loaded = []
    load = common.load_causal_lm

    def recording_load(path, *args, **kwargs):
        loaded.append(kwargs.get("dtype"))
        return load(path, *args, **kwargs)

    monkeypatch.setattr(common, "load_causal_lm", recording_load)
    rloo.main(
        rloo.Args(
            output_dir=str(tmp_path / "out"),
            bf16=True,
            beta=0.05,
            prompts_per_step=4,
            max_steps=2,
            eval_steps=0,
            logging_steps=1,
            save_steps=0,
        )
    )
    assert loaded == [torch.float32, torch.bfloat16, torch.bfloat16]  # policy, reference, sampler
    records = [r for r in common.read_metrics(tmp_path / "out") if "reward" in r]
    assert all(r["grad_norm"] > 0 and r["kl"] is not None and r["entropy"] > 0 for r in records)


@pytest.mark.slow
def test_bf16_run_learns(tmp_path):
    """The quick start with --bf16 (bf16 sampling and reference, autocast policy) raises held-out sampled accuracy, as
    the float32 run does (test_rloo.test_quick_start_learns)."""
    rloo.main(rloo.Args(output_dir=str(tmp_path / "out"), num_generations=4, max_steps=100, eval_steps=0, bf16=True))
    evals = [r for r in common.read_metrics(tmp_path / "out") if "eval/accuracy" in r]
    assert evals[-1]["eval/accuracy"] - evals[0]["eval/accuracy"] >= 0.1


def test_prepared_policy_keeps_bf16_logits_under_autocast():
    """accelerate wraps a prepared model's forward to return float32 outputs under mixed precision; common.prepare
    removes that wrapper, so the (B, T, V) logits stay bf16 under the scripts' own autocast."""
    accelerator = common.make_accelerator(bf16_args())
    model = common.load_causal_lm(common.EMBEDDED_MODEL, dtype=torch.float32)
    model, _ = common.prepare(accelerator, model, torch.optim.AdamW(model.parameters()))
    input_ids = torch.tensor([[3, 4, 5, 6]])
    with accelerator.autocast():
        assert model(input_ids=input_ids).logits.dtype == torch.bfloat16
    assert model(input_ids=input_ids).logits.dtype == torch.float32  # outside autocast: the float32 model itself


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def test_release_freed_memory_returns_the_freed_heap_to_the_os():
    """Freed tensors below glibc's mmap threshold stay in its heap (resident) until common.release_freed_memory."""
    if getattr(common._libc(), "malloc_trim", None) is None:
        pytest.skip("not glibc")

    big = torch.ones(4 * 2**20)  # a 16 MB block, freed: glibc raises its mmap threshold (a 32 MB one would not: over
    del big  # its 32 MB ceiling), so the 1 MB blocks below come from its heap, as they do under map_large_blocks
    blocks = [torch.ones(2**18) for _ in range(300)]  # 300 MB of 1 MB tensors
    keep = blocks[-1]
    del blocks
    before = rss_mb()
    common.release_freed_memory()
    assert before - rss_mb() > 200
    del keep


SMALL_FREE_HEAP_KEPT = """
import sys, torch
sys.path.insert(0, {root!r})
import common
from test_bf16 import rss_mb
big = torch.ones(4 * 2**20)  # as in the test above: the 1 MB blocks below come from the heap
del big
blocks = [torch.ones(2**18) for _ in range(40)]  # 40 MB of 1 MB tensors
keep = blocks[-1]  # the freed ones are not at the top of the heap, where glibc would return them itself
del blocks
assert 30 * 2**20 < common._libc().mallinfo2().fordblks < common.TRIM_THRESHOLD
before = rss_mb()
common.release_freed_memory()
print(round(before - rss_mb()))
"""


def test_release_freed_memory_keeps_a_small_free_heap_for_the_next_step():
    """Below common.TRIM_THRESHOLD of free heap the pages stay: trimming them at every step makes the next step fault
    each one back in (~15% of the embedded model's step time). In a fresh process: the heap is process-wide."""
    if getattr(common._libc(), "mallinfo2", None) is None:
        pytest.skip("not glibc 2.33 or newer")
    code = SMALL_FREE_HEAP_KEPT.format(root=str(Path(common.__file__).parent))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert int(out.strip()) < 10  # malloc_trim would have returned ~39 MB


MAPPED_AFTER_A_LARGE_FREE = """
import sys, torch
sys.path.insert(0, {root!r})
import common
libc = common._libc()
if {fixed}:
    common.map_large_blocks()
big = torch.ones(4 * 2**20)
del big  # a 16 MB block, freed: glibc's dynamic threshold rises to its size
mapped = libc.mallinfo2().hblkhd
block = torch.ones(2**21)  # 8 MB
print(libc.mallinfo2().hblkhd - mapped >= 8 * 2**20)
"""


@pytest.mark.parametrize("fixed", [False, True])
def test_map_large_blocks_keeps_large_tensors_out_of_the_heap(fixed):
    """After a large block is freed, glibc serves the next tensors of up to 32 MB from its heap (where freed fragments
    stay resident until the step ends); with common.map_large_blocks, which every script runs through
    make_accelerator, an 8 MB tensor still gets a mapping of its own. In a fresh process each: the threshold is
    process-wide."""
    if getattr(common._libc(), "mallinfo2", None) is None:
        pytest.skip("not glibc 2.33 or newer")
    code = MAPPED_AFTER_A_LARGE_FREE.format(root=str(Path(common.__file__).parent), fixed=fixed)
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip() == str(fixed)
