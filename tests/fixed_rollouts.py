"""Run a training script with deterministic "sampling", so that a run on N processes can be compared with a run on one.

    python tests/fixed_rollouts.py rloo --max_steps 1 ...                                      # one process
    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 tests/fixed_rollouts.py rloo ...  # two
    PIN_GLOO_BACKEND=1 accelerate launch --config_file configs/fsdp.yaml --num_processes 2 tests/fixed_rollouts.py ...
                                                     # DeepSpeed or FSDP on two CPU processes (pin_gloo_backend)

`common.generate` is replaced by a function of the prompt text and of how many times that text has been seen in the
call (the k-th completion of a prompt's group is always the same text; odd k answer in the format, even k do not),
so both runs train on the same global batch.
The gradient of the first update, after the all-reduce, is saved by the main process to {output_dir}/gradient.pt (not
under DeepSpeed, which clips inside its engine, nor under FSDP, whose gradients are shards).
"""

import importlib
import os
import sys
from pathlib import Path

import torch
from accelerate import Accelerator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import common  # noqa: E402


def fixed_generate(
    model, tokenizer, texts, generation_config, sampler_logprobs=False
):  # nothing is drawn: no log-probs
    seen = {}
    completion_lists = []
    for text in texts:
        k = seen[text] = seen.get(text, -1) + 1
        padding = " so" * (len(text) % 3)  # lengths differ between prompts, so processes hold different token counts
        words = f"{k}{padding} = <answer>{k + len(text) % 5}</answer>" if k % 2 else f"{k} {len(text) % 5}{padding}"
        completion_lists.append(
            tokenizer(words, add_special_tokens=False).input_ids[: generation_config.max_new_tokens - 1]
            + [tokenizer.eos_token_id]
        )
    device = next(model.parameters()).device
    enc = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False).to(device)
    T = max(map(len, completion_lists))
    completion_ids = torch.tensor(
        [ids + [tokenizer.pad_token_id] * (T - len(ids)) for ids in completion_lists], device=device
    )
    return {"prompt_ids": enc.input_ids, "prompt_mask": enc.attention_mask, "completion_ids": completion_ids}


def pin_gloo_backend():
    """Make accelerate set up DeepSpeed or FSDP (as `accelerate launch` with their config asked) over gloo on the CPU.
    accelerate only enables them on a GPU: without one, its PartialState finds no backend and each process runs alone
    (common.make_accelerator then stops). Here the backend search answers gloo as on GPUs, and the device is the CPU."""
    from accelerate import DistributedType
    from accelerate.state import PartialState

    os.environ["ACCELERATE_TORCH_DEVICE"] = "cpu"
    PartialState._prepare_backend = lambda self, *args, **kwargs: ("gloo", DistributedType.MULTI_GPU)


def main():
    if os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true":  # without DeepSpeed's CPU shared-memory all-reduce, an
        # op it compiles at first use (minutes, with a C++ compiler): gloo reduces the same numbers
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    if os.environ.get("PIN_GLOO_BACKEND") == "1":
        pin_gloo_backend()
    script = importlib.import_module(sys.argv[1])
    argv = sys.argv[2:]
    output_dir = Path(argv[argv.index("--output_dir") + 1])
    common.generate = fixed_generate
    clip = Accelerator.clip_grad_norm_

    def save_first_gradient(self, params, max_norm, **kwargs):
        params = list(params)
        path = output_dir / "gradient.pt"
        grads = [p.grad for p in params if p.grad is not None]
        plain = grads and all(type(grad) is torch.Tensor for grad in grads)  # not DeepSpeed's (none) nor FSDP's shards
        if common.PartialState().is_main_process and plain and not path.exists():
            torch.save(torch.cat([grad.flatten() for grad in grads]), path)
        return clip(self, params, max_norm, **kwargs)

    Accelerator.clip_grad_norm_ = save_first_gradient
    common.cli(script.main, script.Args, argv)


if __name__ == "__main__":
    main()
