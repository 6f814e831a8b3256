"""A lever measured and left out: each prompt computed once for its G completions.

    OMP_NUM_THREADS=1 python benchmarks/prompt_once.py

rloo.py's policy pass runs every completion with its own copy of the prompt: B = prompts × G
sequences of P + T tokens. The alternative runs the prompts once (prompts × P tokens, their keys
and values kept in transformers' DynamicCache), repeats that cache G times with its
`batch_repeat_interleave`, and runs only the completions over it (B × T tokens). Both take the
log-probs with rloo.completion_logprobs' log-softmax; the backward flows through the repeated
cache into the prompt's pass. On a random llama135m, 8 prompts × 4 completions of 64 tokens,
under bf16 autocast, for the bench's prompts (27 tokens) and longer ones (256): it prints the
CPU seconds of the policy's forward and backward (the best of 3), and the largest difference
between the two ways' log-probs, in bf16 and (without gradients) in float32.
"""

import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import rloo  # noqa: E402
from bench import SHAPES  # noqa: E402

PROMPTS, G, T, TEMPERATURE = 8, 4, 64, 1.0


def every_sequence(model, prompt_ids, completion_ids):
    """rloo.py's pass: each of the B sequences whole, prompt and completion."""
    input_ids = torch.cat([prompt_ids.repeat_interleave(G, 0), completion_ids], 1)
    mask = torch.ones_like(input_ids)
    return rloo.completion_logprobs(model, input_ids, mask, T, TEMPERATURE)[0]


def prompt_once(model, prompt_ids, completion_ids):
    """The prompts' pass, its cache repeated G times, then the completions' pass over it; the
    same log-softmax in pieces, given the (B, T + 1) logits that the whole sequences would give."""
    prompt = model(input_ids=prompt_ids, use_cache=True, logits_to_keep=1)
    cache = prompt.cache
    cache.batch_repeat_interleave(G)
    P = prompt_ids.shape[1]
    positions = torch.arange(P, P + T)[None].expand(len(completion_ids), T)
    logits = model(input_ids=completion_ids, position_ids=positions, cache=cache).logits
    logits = torch.cat([prompt.logits.repeat_interleave(G, 0), logits], 1)
    input_ids = torch.cat([prompt_ids.repeat_interleave(G, 0), completion_ids], 1)
    mask = torch.ones_like(input_ids)
    computed = lambda **inputs: SimpleNamespace(logits=logits)  # the model call, already made
    return rloo.completion_logprobs(computed, input_ids, mask, T, TEMPERATURE)[0]


def cpu_seconds(function, model, prompt_ids, completion_ids):
    """The best of 3 forward-and-backward CPU seconds, and the log-probs."""
    best = None
    for _ in range(3):
        start = time.process_time()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logprobs = function(model, prompt_ids, completion_ids)
        logprobs.sum().backward()
        seconds = time.process_time() - start
        model.zero_grad(set_to_none=True)
        best = seconds if best is None else min(best, seconds)
    return best, logprobs.detach()


torch.manual_seed(0)
config = transformers.LlamaConfig(**SHAPES["llama135m"])
model = transformers.LlamaForCausalLM(config)
for P in (27, 256):
    prompt_ids = torch.randint(config.vocab_size, (PROMPTS, P))
    completion_ids = torch.randint(config.vocab_size, (PROMPTS * G, T))
    whole, expected = cpu_seconds(every_sequence, model, prompt_ids, completion_ids)
    once, logprobs = cpu_seconds(prompt_once, model, prompt_ids, completion_ids)
    difference = (logprobs - expected).abs().max().item()
    with torch.no_grad():  # the same computation: float32, no autocast
        expected = every_sequence(model, prompt_ids, completion_ids)
        logprobs = prompt_once(model, prompt_ids, completion_ids)
    float32_difference = (logprobs - expected).abs().max().item()
    print(f"P = {P}: every sequence {whole:.2f} s, prompt once {once:.2f} s", end=" ")
    print(f"({once / whole:.2f}x); log-probs within {difference:.1e} in bf16,", end=" ")
    print(f"{float32_difference:.1e} in fp32")
