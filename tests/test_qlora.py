"""QLoRA (--use_peft --load_in_4bit): the frozen base in bitsandbytes' 4 bits, a float32 LoRA adapter that trains, and
π_ref that same base with the adapter disabled. It runs on a CPU (bitsandbytes ≥ 0.50), where sampling (no gradients)
and training forwards alternate."""

import dataclasses

import bitsandbytes as bnb
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import rloo
from conftest import read_metrics


def training(output_dir) -> list[dict]:
    return [
        {k: v for k, v in r.items() if k != "step_time"}
        for r in read_metrics(output_dir)
        if "loss" in r
    ]


@pytest.mark.parametrize("bf16", [False, True])
def test_the_base_is_4_bit_and_only_the_float32_adapter_trains(bf16):
    args = rloo.Args(use_peft=True, load_in_4bit=True, bf16=bf16)
    model = rloo.load_for_training(args, args.model_name_or_path)
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    # q, k, v, o, gate, up, down in each of the 4 layers: every linear layer but the head
    assert len(layers) == 4 * 7
    assert {(layer.weight.dtype, layer.weight.quant_state.quant_type) for layer in layers} == {
        (torch.uint8, "nf4")
    }
    assert {layer.compute_dtype for layer in layers} == {torch.bfloat16 if bf16 else torch.float32}
    trained = {name: p for name, p in model.named_parameters() if p.requires_grad}
    assert trained
    assert all("lora_" in name for name in trained)
    assert {p.dtype for p in trained.values()} == {torch.float32}
    ids = torch.tensor([[5, 6, 7, 8]])
    for _ in range(2):  # a training forward and backward, then sampling, twice
        model.train()
        model(input_ids=ids).logits.float().sum().backward()
        model.eval()
        model.generate(input_ids=ids, max_new_tokens=3, do_sample=False)
    assert all(p.grad is not None for p in trained.values())
    assert all(p.grad.isfinite().all() for p in trained.values())


def test_rloo_trains_the_adapter_against_the_base_and_resumes_exactly(tmp_path, monkeypatch):
    """One model is loaded: π_ref is the policy with its adapter disabled, so the KL is 0 before the first update
    (lora_B starts at 0) and not after it. Two steps in one run equal one, a checkpoint and one more."""
    loads, load = [], AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(
        AutoModelForCausalLM, "from_pretrained", lambda *a, **k: loads.append(a) or load(*a, **k)
    )
    small = dict(
        max_steps=2, prompts_per_step=4, logging_steps=1, eval_strategy="no", save_steps=1
    )
    args = rloo.Args(
        use_peft=True,
        load_in_4bit=True,
        learning_rate=1e-2,
        output_dir=str(tmp_path / "out"),
        **small,
    )
    rloo.main(args)
    assert len(loads) == 1
    out = tmp_path / "out"
    first, second = training(out)
    assert first["kl"] == 0
    assert abs(second["kl"]) > 1e-4
    assert second["grad_norm"] > 0
    adapter = load_file(out / "adapter_model.safetensors")
    assert any(
        name.endswith("lora_B.weight") and weight.abs().max() > 0
        for name, weight in adapter.items()
    )
    checkpoint = str(out / "checkpoint-1")
    rloo.main(
        dataclasses.replace(
            args, output_dir=str(tmp_path / "resumed"), resume_from_checkpoint=checkpoint
        )
    )
    again = load_file(tmp_path / "resumed" / "adapter_model.safetensors")
    assert all(torch.equal(adapter[name], again[name]) for name in adapter)
    assert training(tmp_path / "resumed") == [second]
