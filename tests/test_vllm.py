"""--use_vllm without a GPU: a stand-in `vllm` module (`FakeLLM`) checks what vllm_colocate.py asks of vLLM and what
rloo.py does with its answers: the rollout tensors built from its token ids and log-probs, the policy's weights sent
after every update (a LoRA policy's merged, under the base model's names, its frozen base untouched), sampling from
softmax(logits / T) with no penalties, and TRL's importance-sampling correction of the loss by π_θ_old / π_vllm."""

import math
import os
import sys
import types

import pytest
import torch
from accelerate import Accelerator
from transformers import AutoModelForCausalLM

import common
import rloo
from conftest import EMBEDDED, read_metrics


class FakeLLM:
    """vllm.LLM as vllm_colocate.py uses it. For each prompt, a fixed answer and EOS, or (every third prompt)
    max_tokens tokens and no EOS, with their log-probs at the temperature under the weights last loaded, less `shift`
    per token (then the sampler is not the policy)."""

    instances, shift = [], 0.0

    def __init__(self, model, **kwargs):
        self.kwargs, self.loads, self.calls = kwargs, [], 0
        self.tokenizer = common.load_tokenizer(model)
        dtype = torch.bfloat16 if kwargs["dtype"] == "bfloat16" else torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).eval()
        FakeLLM.instances.append(self)
        load = lambda weights: self.loads.append({name: value.clone() for name, value in weights})
        worker = types.SimpleNamespace(
            model_runner=types.SimpleNamespace(model=types.SimpleNamespace(load_weights=load))
        )
        executor = types.SimpleNamespace(driver_worker=types.SimpleNamespace(worker=worker))
        self.llm_engine = types.SimpleNamespace(model_executor=executor)

    def reset_prefix_cache(self):
        pass

    def generate(self, prompts, sampling_params, use_tqdm):
        self.calls += 1
        answer = self.tokenizer("<answer>5</answer>", add_special_tokens=False).input_ids + [
            self.tokenizer.eos_token_id
        ]
        outputs = []
        for i, prompt in enumerate(prompts):
            assert self.tokenizer.pad_token_id not in prompt["prompt_token_ids"][:1]  # unpadded
            ids = [answer[0]] * sampling_params.max_tokens if i % 3 == 2 else answer
            values = self.logprobs(prompt["prompt_token_ids"], ids, sampling_params.temperature)
            logprobs = [
                {token: types.SimpleNamespace(logprob=value - self.shift)}
                for token, value in zip(ids, values)
            ]
            outputs.append(
                types.SimpleNamespace(
                    outputs=[types.SimpleNamespace(token_ids=ids, logprobs=logprobs)]
                )
            )
        return outputs

    @torch.no_grad()
    def logprobs(self, prompt_ids: list[int], ids: list[int], temperature: float) -> list[float]:
        self.model.load_state_dict(self.loads[-1], strict=False)  # a tied lm_head may be absent
        logits = (
            self.model(torch.tensor([prompt_ids + ids]))
            .logits[0, len(prompt_ids) - 1 : -1]
            .float()
        )
        return (
            (logits / temperature)
            .log_softmax(-1)
            .gather(-1, torch.tensor(ids)[:, None])[:, 0]
            .tolist()
        )


@pytest.fixture(autouse=True)
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.LLM = FakeLLM
    module.SamplingParams = lambda **kwargs: types.SimpleNamespace(**kwargs)
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.delitem(sys.modules, "vllm_colocate", raising=False)  # imports this module
    FakeLLM.instances.clear()
    # the engine sets RANK, WORLD_SIZE, MASTER_PORT, ... for vLLM: undone after
    environment = dict(os.environ)
    yield module
    os.environ.clear()
    os.environ.update(environment)
    FakeLLM.shift = 0.0


def args(tmp_path, **overrides) -> rloo.Args:
    small = dict(
        max_steps=2, prompts_per_step=4, max_completion_length=12, eval_strategy="no", save_steps=0
    )
    # 1 for the fixed answer, 0 for the completion without an end
    small |= dict(reward_funcs=["format"])
    return rloo.Args(
        **{
            **small,
            "logging_steps": 1,
            "use_vllm": True,
            "output_dir": str(tmp_path / "out"),
            **overrides,
        }
    )


def training(output_dir) -> list[dict]:
    return [r for r in read_metrics(output_dir) if "loss" in r]


def test_rollouts_come_from_vllm_and_the_weights_follow_every_update(tmp_path):
    rloo.main(args(tmp_path))
    (llm,) = FakeLLM.instances
    assert llm.calls == 2
    assert llm.kwargs["gpu_memory_utilization"] == 0.3
    assert llm.kwargs["seed"] == 0
    assert len(llm.loads) == 3  # at the start, then after each of the 2 updates
    final = AutoModelForCausalLM.from_pretrained(tmp_path / "out").state_dict()
    # tied embeddings may be sent once
    assert set(llm.loads[-1]) >= set(final) - {"lm_head.weight"}
    assert all(
        torch.equal(llm.loads[-1][name], value)
        for name, value in final.items()
        if name in llm.loads[-1]
    )
    assert not torch.equal(llm.loads[0]["model.norm.weight"], llm.loads[-1]["model.norm.weight"])
    for record in training(tmp_path / "out"):  # prompts 2 and 5 of each 8 have no EOS
        assert record["completions/clipped_ratio"] == 0.25
        # vLLM holds the weights that sampled: π_θ_old / π_vllm is 1, to float error
        assert record["sampling/importance_sampling_ratio/mean"] == pytest.approx(1, abs=1e-4)


def test_vllm_samples_softmax_over_temperature_and_reports_the_log_probs_of_its_tokens(tmp_path):
    """The engine reads no generation_config.json defaults and the sampling parameters switch off every penalty, so
    vLLM draws from the distribution the log-probs describe; it reports each sampled token's log-prob after the
    temperature (TRL's processed_logprobs), which the rollout carries, padded as the ids are."""
    from vllm_colocate import VLLMGenerator

    tokenizer = common.load_tokenizer(EMBEDDED)
    model = AutoModelForCausalLM.from_pretrained(EMBEDDED)
    vllm = VLLMGenerator(
        Accelerator(), args(tmp_path, temperature=0.8), tokenizer, model, [tokenizer.eos_token_id]
    )
    assert vllm.llm.kwargs["generation_config"] == "vllm"
    assert vllm.llm.kwargs["logprobs_mode"] == "processed_logprobs"
    sampling = dict(temperature=0.8, top_p=1.0, top_k=-1, min_p=0.0, logprobs=0)
    no_penalty = dict(repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0)
    length = dict(min_tokens=0, max_tokens=12, stop_token_ids=[tokenizer.eos_token_id])
    neutral = sampling | no_penalty | length
    assert {key: getattr(vllm.sampling_params, key) for key in neutral} == neutral
    out = vllm.generate(["a", "Compute 1 + 2.", "c"], "cpu")
    (llm,) = FakeLLM.instances
    # T of the longest, prompt 2's
    assert out["completion_ids"].shape == out["sampler_logprobs"].shape == (3, 12)
    # padded on the left
    assert out["prompt_ids"][0, 0] == tokenizer.pad_token_id
    assert out["prompt_mask"][0, 0] == 0
    answer = out["completion_ids"][0][
        : (out["completion_ids"][0] == tokenizer.eos_token_id).int().argmax() + 1
    ]
    expected = llm.logprobs(
        tokenizer("a", add_special_tokens=False).input_ids, answer.tolist(), 0.8
    )
    assert torch.allclose(out["sampler_logprobs"][0, : len(answer)], torch.tensor(expected))
    assert (out["sampler_logprobs"][0, len(answer) :] == 0).all()
    assert (out["completion_ids"][0, len(answer) :] == tokenizer.pad_token_id).all()


def test_a_lora_policy_reaches_vllm_merged_under_base_names_and_its_bf16_base_never_moves(
    tmp_path,
):
    """Each sync sends W + scale · B A, built as new tensors: after many syncs the frozen bf16 base is bit-identical
    (merging into it and unmerging in place would round it anew each time)."""
    from vllm_colocate import VLLMGenerator

    run = args(tmp_path, use_peft=True, bf16=True)
    policy = rloo.load_for_training(run, EMBEDDED)
    for name, param in policy.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)  # a trained adapter: B ≠ 0
    base = {
        name: value.clone() for name, value in policy.state_dict().items() if "lora_" not in name
    }
    tokenizer = common.load_tokenizer(EMBEDDED)
    accelerator = Accelerator()
    vllm = VLLMGenerator(accelerator, run, tokenizer, policy, [tokenizer.eos_token_id])
    for _ in range(20):
        vllm.sync_weights(accelerator, policy)
    assert all(torch.equal(value, policy.state_dict()[name]) for name, value in base.items())
    sent = vllm.llm.loads[-1]
    assert "model.layers.0.self_attn.q_proj.weight" in sent
    assert not any(
        "lora_" in name or "base_model" in name or "base_layer" in name for name in sent
    )
    q = policy.base_model.model.model.layers[0].self_attn.q_proj
    expected = (
        q.base_layer.weight
        + q.lora_B["default"].weight @ q.lora_A["default"].weight * q.scaling["default"]
    )
    loaded = sent["model.layers.0.self_attn.q_proj.weight"]
    assert loaded.dtype == torch.bfloat16
    assert torch.equal(loaded, expected.to(torch.bfloat16))
    assert not torch.equal(loaded, q.base_layer.weight)


# π_θ_old (B, T), a sampler's log-probs, and the completion mask. Σ_t (old − sampler) over the mask: row 0: 0.5 − 1.0
# = −0.5; row 1: −0.2; row 2: 1.2, and exp(1.2) = 3.32 is above the cap C = 3.
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.2, -0.7], [0.0, -0.3, -1.0]])
SAMPLER = torch.tensor([[-1.5, -1.0, -9.0], [-0.1, -0.2, -0.7], [-1.2, -0.3, -5.0]])
MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 0]])


@pytest.mark.parametrize("mode, capped", [("sequence_truncate", 3.0), ("sequence_mask", 0.0)])
def test_importance_sampling_weights_by_hand(mode, capped):
    """is_i = exp(Σ_t log π_θ_old − log π_vllm) per completion, capped at C (truncate) or 0 above C (mask)."""
    weights = rloo.importance_sampling_weights(OLD, SAMPLER, MASK, mode=mode, clip_max=3.0)
    assert torch.allclose(weights, torch.tensor([[math.exp(-0.5)], [math.exp(-0.2)], [capped]]))


def test_the_correction_weights_the_loss_when_vllm_is_not_the_policy(tmp_path):
    """vLLM's log-probs below the policy's (less 0.5 per token): every ratio π_θ_old / π_vllm is above a cap C = 2^-10.
    sequence_truncate weighs every completion by C, so the same completions give C times the loss and the gradient
    (its norm before clipping) of the uncorrected run; sequence_mask weighs them all 0."""
    FakeLLM.shift, cap = 0.5, 2**-10  # scaling by a power of two is exact

    def first_step(name, **overrides):
        rloo.main(args(tmp_path, max_steps=1, output_dir=str(tmp_path / name), **overrides))
        return training(tmp_path / name)[0]

    off = first_step("off", vllm_importance_sampling_correction=False)
    assert "sampling/importance_sampling_ratio/mean" not in off
    assert off["grad_norm"] > 0
    truncated = first_step(
        "truncated", vllm_importance_sampling_mode="sequence_truncate", **{CAP: cap}
    )
    assert truncated["sampling/importance_sampling_ratio/mean"] == cap
    assert truncated["grad_norm"] == pytest.approx(cap * off["grad_norm"], rel=1e-6)
    assert truncated["loss"] == pytest.approx(cap * off["loss"], rel=1e-6, abs=1e-12)
    masked = first_step("masked", vllm_importance_sampling_mode="sequence_mask", **{CAP: cap})
    assert (
        masked["sampling/importance_sampling_ratio/mean"]
        == masked["grad_norm"]
        == masked["loss"]
        == 0
    )


CAP = "vllm_importance_sampling_clip_max"
