"""A checkpoint folder shaped like the ones people download, made by the tests (nothing is shipped or fetched).

It differs from the embedded Qwen2 model in every way that has broken RL scripts on real checkpoints: another
architecture (Llama), its own BPE tokenizer with no pad token and another end token (`</s>`), a chat template that
adds a system turn, dropout in the attention (the embedded model has none), and a generation_config.json that sets what
chat checkpoints ship (temperature, top-k/top-p, repetition penalty, min_new_tokens, suppressed and banned tokens, a
second end token). A script that lets any of that leak into sampling, or keeps dropout on between two passes that must
agree, fails the tests that run on it.

Two copies of the embedded model stand for two more things most hub checkpoints do: store their weights in bfloat16
(`make_bf16_checkpoint`), and end a turn with a token that is not the tokenizer's EOS (`make_turn_end_checkpoint`).

A dataset folder shaped like trl-lib/DeepMath-103K, the math dataset of TRL's quick start: `make_deepmath_like_dataset`.
"""

import json
import re
from pathlib import Path

import torch
from datasets import Dataset
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

import common

ROOT = Path(__file__).resolve().parents[1]
EMBEDDED = str(ROOT / "models" / "tiny-arith")


def arithmetic_rows(split: str) -> list[dict]:
    """The built-in task's rows (data/arithmetic/{split}.jsonl): a one-turn conversational prompt, a ground_truth."""
    return [
        json.loads(line)
        for line in (ROOT / "data" / "arithmetic" / f"{split}.jsonl").read_text().splitlines()
    ]


def problem(row: dict) -> tuple[int, str, int, int]:
    """(a, op, b, answer) of a row: 'Compute 7 × 8. ...' with ground_truth '56'."""
    a, op, b = re.match(r"Compute (\d+) (\S) (\d+)\.", row["prompt"][0]["content"]).groups()
    return int(a), op, int(b), int(row["ground_truth"])


CHAT_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}<|system|>\nYou are a careful calculator.</s>\n{% endif %}"
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]


def make_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on the arithmetic task's text; bos <s>, eos </s>, and no pad token."""
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    rows = arithmetic_rows("train") + arithmetic_rows("test")
    corpus = [
        row["prompt"][0]["content"] + f" <answer>{row['ground_truth']}</answer>" for row in rows
    ]
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(corpus + ["You are a careful calculator."], trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def make_hub_like_checkpoint(folder: Path) -> Path:
    tokenizer = make_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        attention_dropout=0.1,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=None,
    )
    model = LlamaForCausalLM(config)
    digit = tokenizer.convert_tokens_to_ids("7")
    # what chat checkpoints ship (Qwen2.5-Instruct-like, and then some)
    model.generation_config = GenerationConfig(
        do_sample=True,
        temperature=0.7,
        top_k=20,
        top_p=0.8,
        repetition_penalty=1.3,
        no_repeat_ngram_size=2,
        min_new_tokens=4,
        min_p=0.05,
        typical_p=0.9,
        bad_words_ids=[[digit]],
        suppress_tokens=[tokenizer.unk_token_id],
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=[tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|user|>")],
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def make_bf16_checkpoint(folder: Path) -> Path:
    """The embedded model saved in bfloat16, as most hub checkpoints are stored (config.json says `"dtype":
    "bfloat16"`): transformers then loads it in bf16 unless asked for another dtype."""
    model = AutoModelForCausalLM.from_pretrained(EMBEDDED, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    common.load_tokenizer(EMBEDDED).save_pretrained(folder)
    return folder


def make_turn_end_checkpoint(folder: Path) -> Path:
    """The embedded model shipped as Llama-3-Instruct is: the tokenizer's EOS is a token the model never emits
    (<|endoftext|>, here also the pad token), and generation_config.json lists, as a second end id, the token that ends
    each of its turns (<|im_end|>, which ends nearly every completion the model samples)."""
    tokenizer = common.load_tokenizer(EMBEDDED)
    model = AutoModelForCausalLM.from_pretrained(EMBEDDED)
    tokenizer.eos_token = "<|endoftext|>"
    model.config.eos_token_id = tokenizer.eos_token_id
    model.generation_config = GenerationConfig(
        eos_token_id=[tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")],
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


DEEPMATH_CARD = """---
configs:
- config_name: default
  data_files:
  - split: train
    path: data/train-*
  - split: test
    path: data/test-*
---
"""


def make_deepmath_like_dataset(folder: Path, train_rows: int = 64, test_rows: int = 16) -> Path:
    """trl-lib/DeepMath-103K's layout: a dataset card naming the splits, parquet files data/train-*.parquet and
    data/test-*.parquet, a conversational `prompt` (one user turn) and a LaTeX `solution`, no other column. Its
    questions are the arithmetic task's, which the embedded model answers as <answer>N</answer>, so that some of its
    completions are right."""
    (folder / "data").mkdir(parents=True)
    (folder / "README.md").write_text(DEEPMATH_CARD)
    for split, n in (("train", train_rows), ("test", test_rows)):
        rows = [
            {"prompt": row["prompt"], "solution": latex_solution(*problem(row))}
            for row in arithmetic_rows(split)[:n]
        ]
        Dataset.from_list(rows).to_parquet(folder / "data" / f"{split}-00000-of-00001.parquet")
    return folder


def latex_solution(a: int, op: str, b: int, answer: int) -> str:
    """'$7$', a bare '-2', or a quotient as the fraction '\\frac{56}{8}' (whose value math-verify compares)."""
    if op == "÷":
        return f"\\frac{{{a}}}{{{b}}}"
    return f"${answer}$" if answer >= 0 else str(answer)
