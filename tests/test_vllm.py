"""--use_vllm without a GPU: a stand-in `vllm` module checks what the scripts ask of it (the rollout tensors built from
its token ids, the weights copied in after every update, LoRA names mapped back to the base model's), that a missing
vllm is one clear line, and that nothing imports vllm unless asked."""

import dataclasses
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import common
import grpo
import ppo
import reinforce
import rloo
from common import ConfigError

ROOT = Path(__file__).resolve().parents[1]


class FakeLLM:
    """Returns, for each prompt, a fixed answer and EOS, or (every third prompt) max_tokens tokens with no EOS, with
    their log-probs at the temperature under the weights last loaded (in bf16 when asked), as vLLM reports them."""

    instances = []

    def __init__(self, model, **kwargs):
        self.kwargs, self.loads, self.calls = kwargs, [], 0
        self.tokenizer = common.load_tokenizer(model)
        dtype = torch.bfloat16 if kwargs["dtype"] == "bfloat16" else torch.float32
        self.model = common.load_causal_lm(model, dtype=dtype).eval()
        FakeLLM.instances.append(self)
        engine_model = types.SimpleNamespace(
            load_weights=lambda weights: self.loads.append({k: v.clone() for k, v in weights})
        )
        worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(model=engine_model))
        self.llm_engine = types.SimpleNamespace(
            model_executor=types.SimpleNamespace(driver_worker=types.SimpleNamespace(worker=worker))
        )

    def reset_prefix_cache(self):
        pass

    def generate(self, prompts, sampling_params, use_tqdm):
        self.calls += 1
        answer = self.tokenizer("<answer>5</answer>", add_special_tokens=False).input_ids + [
            self.tokenizer.eos_token_id
        ]
        outputs = []
        for i, prompt in enumerate(prompts):
            assert (
                isinstance(prompt["prompt_token_ids"], list)
                and self.tokenizer.pad_token_id not in prompt["prompt_token_ids"][:1]
            )
            ids = [answer[0]] * sampling_params.max_tokens if i % 3 == 2 else answer
            logprobs = [
                {token: types.SimpleNamespace(logprob=value)}
                for token, value in zip(
                    ids, self.logprobs(prompt["prompt_token_ids"], ids, sampling_params.temperature)
                )
            ]
            outputs.append(types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=ids, logprobs=logprobs)]))
        return outputs

    @torch.no_grad()
    def logprobs(self, prompt_ids: list[int], ids: list[int], temperature: float) -> list[float]:
        self.model.load_state_dict(self.loads[-1], strict=False)  # a tied lm_head may be absent
        logits = self.model(torch.tensor([prompt_ids + ids])).logits[0, len(prompt_ids) - 1 : -1].float()
        return (logits / temperature).log_softmax(-1).gather(-1, torch.tensor(ids)[:, None]).squeeze(1).tolist()


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.LLM = FakeLLM
    module.SamplingParams = lambda **kwargs: types.SimpleNamespace(**kwargs)
    monkeypatch.setitem(sys.modules, "vllm", module)
    FakeLLM.instances.clear()
    environment = dict(os.environ)  # the engine sets RANK, WORLD_SIZE, MASTER_PORT, ... for vLLM: undo that after
    yield module
    os.environ.clear()
    os.environ.update(environment)


def args(tmp_path, script=rloo, **overrides):
    group = {} if script is ppo else {"num_generations": 2}  # PPO: one completion per prompt, so 8 prompts
    base = script.Args(
        max_steps=2,
        prompts_per_step=8 if script is ppo else 4,
        max_completion_length=12,
        eval_steps=0,
        num_generations_eval=1,
        save_steps=0,
        logging_steps=1,
        use_vllm=True,
        reward_funcs="format",
        output_dir=str(tmp_path / "out"),
        **group,
    )
    return dataclasses.replace(base, **overrides)


@pytest.mark.parametrize("script", [rloo, grpo, reinforce, ppo], ids=lambda m: m.__name__)
def test_rollouts_come_from_vllm_and_weights_follow_every_update(tmp_path, fake_vllm, script):
    script.main(args(tmp_path, script))
    (llm,) = FakeLLM.instances
    assert llm.calls == 2 and llm.kwargs["gpu_memory_utilization"] == 0.3
    assert len(llm.loads) == 3  # at the start, then after each of the 2 updates
    final = common.load_causal_lm(str(tmp_path / "out")).state_dict()
    assert set(llm.loads[-1]) >= set(final) - {"lm_head.weight"}  # tied embeddings may be saved once
    assert all(torch.equal(llm.loads[-1][name], value) for name, value in final.items() if name in llm.loads[-1])
    assert not torch.equal(llm.loads[0]["model.norm.weight"], llm.loads[-1]["model.norm.weight"])
    records = [r for r in common.read_metrics(str(tmp_path / "out")) if "completions/clipped_ratio" in r]
    assert records[0]["completions/clipped_ratio"] == pytest.approx(0.25)  # prompts 2 and 5 of 8 have no EOS
    assert records[0]["completions/max_length"] == 12


def test_vllm_samples_softmax_over_temperature_whatever_the_checkpoint_ships(tmp_path, fake_vllm):
    """The engine reads no generation_config.json defaults, and the sampling parameters switch off every penalty, so
    vLLM draws from the distribution the log-probs describe, as transformers does (tests/test_on_policy.py)."""
    from vllm_colocate import VLLMGenerator

    vllm = VLLMGenerator(
        common.make_accelerator(args(tmp_path)),
        args(tmp_path, temperature=0.8),
        common.load_tokenizer(common.EMBEDDED_MODEL),
        common.load_causal_lm(common.EMBEDDED_MODEL),
        end_ids=[2],  # the embedded model's EOS
    )
    assert vllm.llm.kwargs["generation_config"] == "vllm"
    neutral = dict(
        temperature=0.8,
        top_p=1.0,
        top_k=-1,
        min_p=0.0,
        repetition_penalty=1.0,
        presence_penalty=0.0,
        frequency_penalty=0.0,
        min_tokens=0,
    )
    assert {key: getattr(vllm.sampling_params, key) for key in neutral} == neutral


def test_lora_weights_reach_vllm_merged_under_base_names(tmp_path, fake_vllm):
    rloo.main(args(tmp_path, use_peft=True, max_steps=1))
    (llm,) = FakeLLM.instances
    names = set(llm.loads[-1])
    assert "model.layers.0.self_attn.q_proj.weight" in names
    assert not any("lora_" in n or "base_model" in n or "base_layer" in n for n in names)


def test_missing_vllm_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    with pytest.raises(ConfigError, match="--use_vllm: the vllm package is not installed"):
        rloo.main(args(tmp_path))
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_nothing_imports_vllm_unless_asked():
    code = "import sys, rloo, grpo, reinforce, ppo, common; assert 'vllm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
