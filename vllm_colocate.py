"""The colocated vLLM engine for `--use_vllm`: only a run with that flag imports this file.

Copy it next to a training script only if you sample with vLLM.
"""

import contextlib
import os

import torch
import vllm  # pip install vllm
from accelerate import Accelerator

import common


class VLLMGenerator:
    """Colocated vLLM sampling (`--use_vllm`, TRL's vllm_mode="colocate"): each training process
    runs its own engine on its GPU, with `--vllm_gpu_memory_utilization` of the memory; the
    policy's weights are copied into it at the start and after every update (`sync_weights`)."""

    def __init__(self, accelerator: Accelerator, args, tokenizer, model, end_ids: list[int]):
        # vLLM's "external_launcher" joins the process group of `accelerate launch`
        for key, value in {
            "RANK": accelerator.process_index,
            "LOCAL_RANK": accelerator.local_process_index,
            "WORLD_SIZE": accelerator.num_processes,
            "MASTER_ADDR": "localhost",
            "MASTER_PORT": 29511,
        }.items():
            os.environ.setdefault(key, str(value))
        # the engine lives in this process: weights set in place
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self.llm = vllm.LLM(
            model=args.model_name_or_path,
            gpu_memory_utilization=args.vllm_gpu_memory_utilization,
            distributed_executor_backend="external_launcher",
            seed=args.seed + accelerator.process_index,
            dtype="bfloat16" if args.bf16 else "auto",
            max_model_len=args.vllm_max_model_length,
            generation_config="vllm",  # no sampling defaults from generation_config.json
            logprobs_mode="processed_logprobs",  # after the temperature, as TRL's IS weights
        )
        # softmax(logits / temperature), as common.sampling_config: no penalties
        self.sampling_params = vllm.SamplingParams(
            n=1,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k or -1,
            min_p=0.0,
            repetition_penalty=1.0,
            presence_penalty=0.0,
            frequency_penalty=0.0,
            min_tokens=0,
            max_tokens=args.max_completion_length,
            stop_token_ids=end_ids,  # the sampling config's (and PPO's --stop_token), as generate
            logprobs=0,  # the sampled token's log-prob only
        )
        self.tokenizer = tokenizer
        self.sync_weights(accelerator, model)

    @torch.no_grad()
    def sync_weights(self, accelerator: Accelerator, model):
        """Load the policy's current weights into the engine. A LoRA policy's merged weights
        W + scale · B A are new tensors (peft's `get_delta_weight`): merging into the frozen base
        and unmerging in place would round it, in bf16, a little differently at every sync."""
        plugin = accelerator.state.deepspeed_plugin
        policy = accelerator.unwrap_model(model)
        gathered = contextlib.nullcontext()
        if plugin is not None and plugin.zero_stage == 3:  # the sharded weights gathered meanwhile
            import deepspeed

            gathered = deepspeed.zero.GatheredParameters(list(model.parameters()))
        with gathered:
            weights = policy.state_dict().items()
            if hasattr(policy, "get_base_model"):
                lora = {
                    f"{n}.base_layer.weight": m
                    for n, m in policy.named_modules()
                    if hasattr(m, "get_delta_weight")
                }

                # W + scale · B A, a new tensor; the base weight is only read
                def merged(name, weight):
                    if name not in lora:
                        return weight
                    delta = sum(
                        lora[name].get_delta_weight(adapter)
                        for adapter in lora[name].active_adapters
                    )
                    return (weight + delta).to(weight.dtype)

                # one layer at a time, under the base model's names; the adapters are not copied
                weights = (
                    (
                        name.removeprefix("base_model.model.").replace(".base_layer", ""),
                        merged(name, value),
                    )
                    for name, value in weights
                    if "lora_" not in name
                )
            self._engine_model().load_weights(weights)
        self.llm.reset_prefix_cache()  # cached prompt states were computed with the old weights

    def _engine_model(self):
        return self.llm.llm_engine.model_executor.driver_worker.worker.model_runner.model

    def generate(self, texts: list[str], device) -> dict:
        """One completion per text: `common.generate`'s tensors, with the sampler's log-probs."""
        prompt_ids, prompt_mask = common.encode(self.tokenizer, texts, device)
        prompts = [
            {"prompt_token_ids": ids[mask.bool()].tolist()}
            for ids, mask in zip(prompt_ids, prompt_mask)
        ]
        outputs = [
            out.outputs[0]
            for out in self.llm.generate(prompts, self.sampling_params, use_tqdm=False)
        ]
        T = max(len(out.token_ids) for out in outputs)
        padded = [
            list(out.token_ids) + [self.tokenizer.pad_token_id] * (T - len(out.token_ids))
            for out in outputs
        ]
        logprobs = [
            [position[token].logprob for token, position in zip(out.token_ids, out.logprobs)]
            + [0.0] * (T - len(out.token_ids))
            for out in outputs
        ]
        return {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "completion_ids": torch.tensor(padded, device=device),
            "sampler_logprobs": torch.tensor(logprobs, device=device),  # (B, T), for is_i
        }
