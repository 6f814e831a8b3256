"""tools/convert_gguf.py on a tiny GGUF file that the test writes with the gguf package: no download. The folder it
makes loads as a plain float32 model, without gguf, with its tokenizer, chat template and end token."""

import subprocess
import sys

import gguf
import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
from convert_gguf import convert  # noqa: E402

TOKENS = ["<|im_start|>", "<|im_end|>", "a", "b", "Ġ", "ab", "c", "d"]
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
LAYER = {
    "attn_q": (16, 16),
    "attn_k": (8, 16),
    "attn_v": (8, 16),
    "attn_output": (16, 16),
    "ffn_gate": (32, 16),
    "ffn_up": (32, 16),
    "ffn_down": (16, 32),
}


def write_tiny_gguf(path):
    """A one-layer llama in float32 with a byte-level BPE vocabulary of 8, as llama.cpp lays it out."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(16)
    writer.add_block_count(1)
    writer.add_feed_forward_length(32)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(TOKENS))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(TOKENS)
    writer.add_token_types([3, 3, 1, 1, 1, 1, 1, 1])
    writer.add_token_merges(["a b"])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_pad_token_id(1)
    writer.add_chat_template(TEMPLATE)
    rng = np.random.default_rng(0)
    embedding = rng.standard_normal((len(TOKENS), 16)).astype(np.float32)
    writer.add_tensor("token_embd.weight", embedding)
    writer.add_tensor("output_norm.weight", np.ones(16, np.float32))
    for name, shape in LAYER.items():
        writer.add_tensor(f"blk.0.{name}.weight", rng.standard_normal(shape).astype(np.float32))
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(16, np.float32))
    writer.add_tensor("blk.0.ffn_norm.weight", np.ones(16, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return embedding


def test_the_converted_folder_is_a_plain_model_with_its_tokenizer(tmp_path):
    embedding = write_tiny_gguf(tmp_path / "tiny.gguf")
    folder = convert(tmp_path / "tiny.gguf", tmp_path / "model")
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert model.config.model_type == "llama"
    assert model.config.num_hidden_layers == 1
    assert not hasattr(model.config, "quantization_config")  # reloads without gguf
    assert torch.equal(model.get_input_embeddings().weight, torch.from_numpy(embedding))
    assert tokenizer.eos_token == "<|im_end|>"
    assert model.generation_config.eos_token_id == 1
    text = tokenizer.apply_chat_template([{"role": "user", "content": "ab"}], tokenize=False)
    assert text == "<|im_start|>ab<|im_end|>"
    assert sorted(p.name for p in folder.glob("*.safetensors")) == ["model.safetensors"]


def test_the_command_converts_a_file_given_to_it_and_prints_the_folder(tmp_path):
    write_tiny_gguf(tmp_path / "tiny.gguf")
    command = [sys.executable, "tools/convert_gguf.py", tmp_path / "tiny.gguf", tmp_path / "model"]
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == str(tmp_path / "model")
    assert (tmp_path / "model" / "config.json").exists()
