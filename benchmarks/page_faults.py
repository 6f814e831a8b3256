"""What the log-softmax's pieces cost in page faults and memory, at llama135m's shape.

    OMP_NUM_THREADS=1 python benchmarks/page_faults.py

The scripts' completion_logprobs makes the float32 log-softmax over the vocabulary in pieces of
`chunk` elements, 64 MB. glibc's malloc gives a block over 32 MB a mapping of its own, handed back
to the kernel when it is freed, so such a piece is paged in again (fresh zeroed pages) at every
call; it serves smaller blocks from its heap, reused from call to call but kept when freed. This
runs what an `rloo.py --bf16` step does with the log-probs: the reference's pass without
gradients, then the policy's pass with the entropy and its backward, on a random llama135m (32
completions of 64 tokens after 27 prompt tokens), three ways, each in a process of its own: the
scripts' 64 MB pieces, 16 MB pieces (on the heap), and 64 MB pieces with glibc's variables
putting every block on the heap and never trimming it (HEAP). It prints the user and system CPU
seconds and the page faults of the best of 3 steps after a warm-up, and the process's peak RSS.
"""

import os
import resource
import subprocess
import sys
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import rloo  # noqa: E402
from bench import SHAPES  # noqa: E402

B, P, T = 32, 27, 64
HEAP = {"MALLOC_MMAP_THRESHOLD_": str(2**28), "MALLOC_TRIM_THRESHOLD_": str(2**32)}
RUNS = {"64 MB pieces": (2**24, {}), "16 MB pieces": (2**22, {}), "64 MB, HEAP": (2**24, HEAP)}


def step(policy, reference, input_ids, attention_mask, chunk: int):
    """The reference's log-probs, then the policy's with the entropy, and their backward."""
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        rloo.completion_logprobs(reference, input_ids, attention_mask, T, 1.0, chunk=chunk)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logprobs, _ = rloo.completion_logprobs(
            policy, input_ids, attention_mask, T, 1.0, entropy=True, chunk=chunk
        )
    logprobs.sum().backward()
    policy.zero_grad(set_to_none=True)


def measure(label: str):
    chunk = RUNS[label][0]
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**SHAPES["llama135m"])
    policy = transformers.LlamaForCausalLM(config)
    reference = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
    input_ids = torch.randint(config.vocab_size, (B, P + T))
    attention_mask = torch.ones_like(input_ids)
    runs = []
    for _ in range(4):
        times = os.times()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        step(policy, reference, input_ids, attention_mask, chunk)
        after = os.times()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        runs.append((after.user - times.user, after.system - times.system, faults))
    user, system, faults = min(runs[1:], key=lambda run: run[0] + run[1])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux
    print(f"{label}: user {user:.2f} s, system {system:.2f} s", end=", ")
    print(f"{faults:,} page faults, peak RSS {peak:.0f} MB")


if len(sys.argv) > 1:
    measure(sys.argv[1])
else:
    for label, (_, variables) in RUNS.items():
        environment = {**os.environ, **variables}
        subprocess.run([sys.executable, __file__, label], env=environment, check=True)
