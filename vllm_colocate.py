"""The colocated vLLM engine for `--use_vllm`: only a run with that flag imports this file (and vllm).

Copy it next to a training script only if you sample with vLLM.
"""

import contextlib
import os

import torch
from accelerate import Accelerator


class VLLMGenerator:
    """Colocated vLLM sampling (`--use_vllm`, as TRL's vllm_mode="colocate"): each training process runs its own vLLM
    engine on its own GPU, in the same process, with `--vllm_gpu_memory_utilization` of the memory, and the policy's
    weights are copied into it at the start (a resumed run's) and after every update (`sync_weights`). vllm is
    imported only here."""

    def __init__(self, accelerator: Accelerator, args, tokenizer, model, end_ids: list[int]):
        import vllm  # pip install vllm

        if args.load_in_4bit:
            raise ValueError(
                "vLLM is sent the policy's full weights, which a 4-bit base (--load_in_4bit) lacks"
            )
        # vLLM's "external_launcher" joins the process group that `accelerate launch` (or a single process) describes
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
            generation_config="vllm",  # the checkpoint's generation_config.json sets no sampling defaults
            logprobs_mode="processed_logprobs",  # the log-probs after the temperature, as TRL asks for its IS weights
        )
        self.sampling_params = vllm.SamplingParams(  # softmax(logits / temperature), as sampling_config: no penalties
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
            stop_token_ids=end_ids,  # the sampling config's end ids (and PPO's --stop_token): ended as generate ends
            logprobs=0,  # the sampled token's log-prob only
        )
        self.tokenizer = tokenizer
        self.sync_weights(accelerator, model)

    @torch.no_grad()
    def sync_weights(self, accelerator: Accelerator, model):
        """Load the policy's current weights into the engine. A LoRA policy's merged weights W + scale · B A are built
        as new tensors (peft's `get_delta_weight`): merging into the frozen base and unmerging it in place would round
        it, in bf16, a little differently at every sync."""
        plugin, policy = accelerator.state.deepspeed_plugin, accelerator.unwrap_model(model)
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

                def merged(
                    name, weight
                ):  # W + scale · B A, a new tensor; the base weight is only read
                    if name not in lora:
                        return weight
                    delta = sum(
                        lora[name].get_delta_weight(adapter)
                        for adapter in lora[name].active_adapters
                    )
                    return (weight + delta).to(weight.dtype)

                weights = (  # one layer at a time, under the base model's names; the adapters are not copied
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
        """Sample one completion per text; the same tensors as `common.generate`, with the sampler's log-probs."""
        enc = self.tokenizer(
            texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False
        ).to(device)
        prompts = [
            {"prompt_token_ids": ids[mask.bool()].tolist()}
            for ids, mask in zip(enc.input_ids, enc.attention_mask)
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
            "prompt_ids": enc.input_ids,
            "prompt_mask": enc.attention_mask,
            "completion_ids": torch.tensor(padded, device=device),
            "sampler_logprobs": torch.tensor(
                logprobs, device=device
            ),  # (B, T), for the importance-sampling weights
        }
