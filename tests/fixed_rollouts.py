"""Run a training script with fixed completions in place of sampling, so that runs on other process counts or engines
train on the same batches:

    python tests/fixed_rollouts.py rloo --max_steps 1 --output_dir out ...                            # one process
    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 tests/fixed_rollouts.py rloo ...   # DDP
    PIN_GLOO_BACKEND=1 accelerate launch --config_file configs/fsdp.yaml --num_processes 2 \\
        tests/fixed_rollouts.py rloo ...                  # DeepSpeed or FSDP on two CPU processes (`pin_gloo_backend`)
    CHECK_END_TRAINING=1 ACCELERATE_USE_CPU=1 accelerate launch ...     # DDP, the group freed by end_training (below)

The first argument names the script (rloo for rloo.py); the others are its flags, and it runs as `python rloo.py`
does, with `common.generate` replaced by `fixed_generate` (completions that depend on the prompt text alone), and
`Accelerator.clip_grad_norm_` by `gradient_saver`'s (which writes the first update's gradient, and the engine that
accelerate set up, to the output folder).
"""

import importlib
import importlib.util
import json
import os
import runpy
import sys
from pathlib import Path

import torch
from accelerate import Accelerator, PartialState

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import common  # noqa: E402


def fixed_generate(model, tokenizer, texts, config, sampler_logprobs=False) -> dict:
    """`common.generate`'s tensors, with completions that depend only on the text and on how many times the text came
    before in the call: the k-th completion of a prompt's group is always the same. Odd k answer in the format, even k
    do not, so that the rewards of a group differ; lengths differ between prompts, so the processes' shares hold
    different numbers of tokens. Nothing is drawn, so there are no sampler log-probs."""
    seen, completions = {}, []
    for text in texts:
        k = seen[text] = seen.get(text, -1) + 1
        padding = " so" * (len(text) % 3)
        if k % 2:
            words = f"{k}{padding} = <answer>{k + len(text) % 5}</answer>"
        else:
            words = f"{k} {len(text) % 5}{padding}"
        ids = tokenizer(words, add_special_tokens=False).input_ids[: config.max_new_tokens - 1]
        completions.append(ids + [tokenizer.eos_token_id])
    prompt_ids, prompt_mask = common.encode(tokenizer, texts, next(model.parameters()).device)
    # a forward pass, as sampling runs them: through the engine's hooks (ZeRO-3's, FSDP's)
    with torch.no_grad():
        model(input_ids=prompt_ids, attention_mask=prompt_mask)
    T = max(map(len, completions))
    padded = [ids + [tokenizer.pad_token_id] * (T - len(ids)) for ids in completions]
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": torch.tensor(padded).to(prompt_ids),
    }


def gradient_saver(output_dir: Path):
    """An `Accelerator.clip_grad_norm_` that, called the first time, has the main process write what it was given to
    output_dir: the gradient, all-reduced and not yet clipped, to gradient.pt (a plain tensor's only: not under
    DeepSpeed, which keeps it in its engine, nor under FSDP, whose gradients are shards), and the engine that
    accelerate set up to engine.json."""
    clip = Accelerator.clip_grad_norm_

    def save_then_clip(self, parameters, max_norm, **kwargs):
        parameters = list(parameters)
        if self.is_main_process and not (output_dir / "engine.json").exists():
            grads = [p.grad for p in parameters if p.grad is not None]
            if grads and all(type(grad) is torch.Tensor for grad in grads):
                torch.save(
                    torch.cat([grad.flatten() for grad in grads]), output_dir / "gradient.pt"
                )
            deepspeed, fsdp = self.state.deepspeed_plugin, getattr(self.state, "fsdp_plugin", None)
            engine = {"type": self.distributed_type.value, "processes": self.num_processes}
            engine["zero_stage"] = getattr(deepspeed, "zero_stage", None)
            engine["fsdp_version"] = getattr(fsdp, "fsdp_version", None)
            (output_dir / "engine.json").write_text(json.dumps(engine))
        return clip(self, parameters, max_norm, **kwargs)

    return save_then_clip


def pin_gloo_backend():
    """Make accelerate set up DeepSpeed or FSDP, as `accelerate launch` with their config asks, over gloo on the CPU.
    accelerate enables them on a GPU only: without one, its PartialState finds no backend, and each process runs alone.
    Here its backend search answers gloo, as it answers nccl on GPUs, and the device is the CPU."""
    from accelerate import DistributedType

    os.environ["ACCELERATE_TORCH_DEVICE"] = "cpu"
    backend = ("gloo", DistributedType.MULTI_GPU)
    PartialState._prepare_backend = lambda self, *args, **kwargs: backend


def check_end_training():
    """Make `Accelerator.end_training` end the run with exit status 3 when gloo's worker threads outlive it: something
    else then holds the process group (a DDP wrapper the script has not freed) and frees it later, stopping the workers
    while it holds the GIL, which one of them may still need to free the tensors of the last collective. That is a hang
    at exit in some runs; this makes it a failure in every run. deepspeed is imported first, as if it were not
    installed: imported once the group exists (accelerate imports it to unwrap a model), it holds the group in a
    default argument (`deepspeed.comm`'s `monitored_barrier(group=GroupMember.WORLD)`) until the interpreter exits."""
    if importlib.util.find_spec("deepspeed") is not None:
        importlib.import_module("deepspeed")
    end_training = Accelerator.end_training

    def end_training_then_check(self):
        end_training(self)
        tasks = Path("/proc/self/task")
        threads = [(tasks / task / "comm").read_text().strip() for task in os.listdir(tasks)]
        if "pt_gloo_runloop" in threads:  # the name torch gives gloo's worker threads
            print(
                "error: gloo's worker threads outlived end_training", file=sys.stderr, flush=True
            )
            os._exit(3)  # now: freeing the wrapper on the way out may hang

    Accelerator.end_training = end_training_then_check


def main():
    if os.environ.get("PIN_GLOO_BACKEND") == "1":
        pin_gloo_backend()
    if os.environ.get("CHECK_END_TRAINING") == "1":
        check_end_training()
    # not DeepSpeed's CPU shared-memory all-reduce, an op it compiles at first use (minutes,
    # with a C++ compiler): gloo reduces the same numbers
    if os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true":
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    script, flags = sys.argv[1], sys.argv[2:]
    output_dir = Path(flags[flags.index("--output_dir") + 1])
    common.generate = fixed_generate
    Accelerator.clip_grad_norm_ = gradient_saver(output_dir)
    sys.argv = [str(ROOT / f"{script}.py"), *flags]
    runpy.run_path(sys.argv[0], run_name="__main__")  # as `python rloo.py flags`


if __name__ == "__main__":
    main()
