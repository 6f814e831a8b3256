"""QLoRA (--load_in_4bit --use_peft): the frozen base is bitsandbytes 4-bit, only the float32 LoRA adapter trains, and
the scripts train, checkpoint, resume and merge with it on a CPU (bitsandbytes ≥ 0.50). Combinations that cannot
work are one line."""

import dataclasses

import bitsandbytes as bnb
import pytest
import torch
from peft import get_peft_model
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import common
import grpo
import ppo
import reinforce
import rloo
import sft

FAST = dict(max_steps=2, eval_steps=0, logging_steps=1, save_steps=0, use_peft=True, load_in_4bit=True)
RUNS = {  # a run of two steps; a high learning rate, so that two steps move the adapter visibly
    rloo: dict(prompts_per_step=4, learning_rate=1e-2),
    grpo: dict(prompts_per_step=4, num_generations=4, learning_rate=1e-2),
    reinforce: dict(prompts_per_step=4, learning_rate=1e-2),
    sft: dict(train_batch_size=8, samples_per_problem=2, num_generations_eval=1, learning_rate=1e-2),
}


def args(module, tmp_path, **overrides):
    return module.Args(**{"output_dir": str(tmp_path / "out"), **FAST, **RUNS[module], **overrides})


def losses(output_dir) -> list[float]:
    return [r["loss"] for r in common.read_metrics(output_dir) if "loss" in r]


@pytest.mark.parametrize("bf16", [False, True])
def test_the_base_is_4_bit_and_only_the_float32_adapter_trains(bf16):
    run = rloo.Args(use_peft=True, load_in_4bit=True, bf16=bf16)
    model = common.load_causal_lm(run.model_name_or_path, dtype=torch.float32, **common.quantization(run))
    model = get_peft_model(model, common.lora_config(run, model))
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(layers) == 4 * 7  # q, k, v, o, gate, up, down in each of the 4 layers: every linear layer but the head
    assert {layer.weight.quant_state.quant_type for layer in layers} == {"nf4"}
    assert {layer.compute_dtype for layer in layers} == {torch.bfloat16 if bf16 else torch.float32}
    trained = {name: p for name, p in model.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in name for name in trained)
    assert {p.dtype for p in trained.values()} == {torch.float32}
    # a forward, a backward and a generate, and a training forward after it (bitsandbytes repacks for inference)
    ids = torch.tensor([[5, 6, 7, 8]])
    for _ in range(2):
        model.train()
        model(input_ids=ids).logits.float().sum().backward()
        model.eval()
        model.generate(input_ids=ids, max_new_tokens=3, do_sample=False)
    assert all(p.grad is not None and p.grad.isfinite().all() for p in trained.values())
    assert not any(p.grad is not None for name, p in model.named_parameters() if name not in trained)


def test_rloo_trains_the_adapter_resumes_and_merges_into_the_full_precision_base(tmp_path):
    """Four steps in one run equal two, a checkpoint and two more; --save_merged_model merges the adapter into the
    base at full precision, a model that loads without bitsandbytes."""
    full = args(rloo, tmp_path, max_steps=4, save_steps=2, save_merged_model=True)
    rloo.main(full)
    out = tmp_path / "out"
    assert all(torch.isfinite(torch.tensor(loss)) for loss in losses(out)) and len(losses(out)) == 4
    first, last = (
        load_file(out / "checkpoint-2" / "adapter_model.safetensors"),
        load_file(out / "adapter_model.safetensors"),
    )
    assert any(not torch.equal(first[k], last[k]) for k in last)  # the adapter trains
    assert any(k.endswith("lora_B.weight") and last[k].abs().max() > 0 for k in last)  # lora_B starts at zero

    rloo.main(
        dataclasses.replace(
            full, output_dir=str(tmp_path / "resumed"), resume_from_checkpoint=str(out / "checkpoint-2")
        )
    )
    again = load_file(tmp_path / "resumed" / "adapter_model.safetensors")
    assert all(torch.equal(last[k], again[k]) for k in last)

    merged = AutoModelForCausalLM.from_pretrained(out / "merged")
    assert getattr(merged.config, "quantization_config", None) is None
    assert {p.dtype for p in merged.parameters()} == {torch.float32}
    base = AutoModelForCausalLM.from_pretrained(common.EMBEDDED_MODEL)
    changed = [n for (n, p), q in zip(merged.named_parameters(), base.parameters()) if not torch.equal(p, q)]
    assert changed and all("proj" in name for name in changed)  # the adapted linear layers, and only those


@pytest.mark.parametrize("module", [grpo, reinforce, sft], ids=["grpo", "reinforce", "sft"])
def test_the_other_scripts_train_the_adapter_of_a_4_bit_base(tmp_path, module):
    module.main(args(module, tmp_path, eval_strategy="no"))
    out = tmp_path / "out"
    assert len(losses(out)) == 2 and all(torch.isfinite(torch.tensor(loss)) for loss in losses(out))
    adapter = load_file(out / "adapter_model.safetensors")
    assert any(k.endswith("lora_B.weight") and adapter[k].abs().max() > 0 for k in adapter)


@pytest.mark.parametrize(
    "script, flags, line",
    [
        ("rloo.py", ["--load_in_4bit"], "error: --load_in_4bit: the 4-bit base is frozen, only a LoRA adapter trains"),
        ("grpo.py", ["--load_in_4bit", "--use_peft", "--use_vllm"], "error: --use_vllm: not with --load_in_4bit"),
        (
            "reinforce.py",
            ["--load_in_4bit", "--use_peft", "--bnb_4bit_quant_type", "int4"],
            "error: --bnb_4bit_quant_type: must be nf4 or fp4, got int4",
        ),
        (
            "sft.py",
            ["--load_in_4bit", "--use_peft", "--from_scratch"],
            "error: --load_in_4bit: quantizes a pretrained base, not a model --from_scratch builds",
        ),
        (
            "ppo.py",
            ["--load_in_4bit", "--use_peft"],
            "error: --load_in_4bit: ppo.py trains a value model beside the policy",
        ),
    ],
)
def test_what_cannot_work_is_one_line(tmp_path, capsys, script, flags, line):
    module = {"rloo.py": rloo, "grpo.py": grpo, "reinforce.py": reinforce, "sft.py": sft, "ppo.py": ppo}[script]
    with pytest.raises(SystemExit) as exit_info:
        common.cli(module.main, module.Args, [*flags, "--output_dir", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(line)
    assert not (tmp_path / "out").exists()
