"""Builds an untrained tiny model for the arithmetic task: a byte-level BPE tokenizer trained on the task's text (a
Qwen2Tokenizer, so AutoTokenizer reloads it unchanged) and a small Qwen2 model around it. models/tiny-arith is this
model after sft.py's default run on data/arithmetic_sft:

    python tools/make_tiny_model.py outputs/tiny-init
    python sft.py --model_name_or_path outputs/tiny-init --output_dir models/tiny-arith --overwrite_output_dir
"""

import gzip
import json
import sys
from itertools import islice
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2Tokenizer

DATA = Path(__file__).resolve().parents[1] / "data" / "arithmetic_sft" / "train.jsonl.gz"
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tiny_model(
    folder: str, hidden_size=128, num_hidden_layers=4, vocab_size=384, max_length=128, seed=0
):
    renderer = Qwen2Tokenizer()
    renderer.chat_template = CHATML
    with gzip.open(DATA, "rt") as f:
        rows = [json.loads(line) for line in islice(f, 5000)]
    corpus = [
        renderer.apply_chat_template(row["prompt"] + row["completion"], tokenize=False)
        for row in rows
    ]
    corpus += [str(n) for n in range(-100, 100)] + [
        " +-×÷=<>/.,:;?!()[]{}'\"\n\t abcdefghijklmnopqrstuvwxyz"
    ]
    tokenizer = renderer.train_new_from_iterator(
        corpus, vocab_size=vocab_size, new_special_tokens=["<|im_start|>", "<|im_end|>"]
    )
    tokenizer.eos_token, tokenizer.pad_token = "<|im_end|>", "<|endoftext|>"
    tokenizer.chat_template, tokenizer.padding_side = CHATML, "left"
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=3 * hidden_size,
        num_hidden_layers=num_hidden_layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=max_length, tie_word_embeddings=True, bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


if __name__ == "__main__":
    make_tiny_model(sys.argv[1])
