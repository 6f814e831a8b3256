"""Benchmark: step time, throughput and peak memory of rloo.py, grpo.py, reinforce.py and ppo.py, and optionally of
TRL's RLOOTrainer on the identical model and batch.

What is measured, and how:

- Each (config, algorithm, repeat) is one training run in its own child process: the script's own `main`, unchanged,
  with --logging_steps 1, no checkpoints, and no evaluation (the prompts, data/arithmetic/train.jsonl, are copied into
  a one-split data file, so there is no held-out split to evaluate on). Runs go repeat by repeat, so a background load
  hits every algorithm alike; the table shows the median over repeats.
- Step time: the script's own `step_time` in metrics.jsonl, the wall clock of a whole step (sample prompts, generate,
  score, forward and backward passes, optimizer step, metrics). The first --warmup_steps are dropped; the median of
  the rest is the run's step time. Also the child's median CPU time per step (from one step's metrics record to the
  next: the child wraps the script's `log`), which other jobs on a shared machine inflate far less than the wall
  clock. completions/s = completions per step / median step time; generated tokens/s = the median over steps of (real
  completion tokens of the step, up to and including EOS) / step time.
- Peak memory: on CPU, the child's peak resident set size (Linux's VmHWM, as the child reports it: os.wait4's
  ru_maxrss would count the parent's resident size at the fork too), and the same above the child's peak RSS right
  after its imports (torch alone is several hundred MB, which dilutes any ratio); on CUDA,
  torch.cuda.max_memory_allocated, reported by the child. Peak RSS depends on glibc's allocator, which keeps freed
  large blocks: with MALLOC_MMAP_THRESHOLD_=65536 in the environment (the children inherit it) it follows live memory
  more closely, at the cost of slower steps.
- The same batch for all: 32 completions per step, 8 prompts × 4 completions (rloo, grpo, trl_rloo) or 32 prompts × 1
  (reinforce, ppo); β = 0.05 everywhere (ppo: --kl_coef 0.05), so every script loads a reference model. Every other
  flag is the script's default (ppo: its PPO epochs on each batch, a value model from the policy's backbone).
- Configs: `embedded`, models/tiny-arith (0.83M parameters; completions of at most 24 tokens, the scripts' default;
  the model stops early at EOS); `random30m`, a randomly initialized 31.7M-parameter Qwen2 (hidden 512, 10 layers) with
  the embedded tokenizer and at most 64-token completions: compute-bound, and with random weights EOS is rare, so
  nearly every completion is 64 tokens (the mean length is reported); `llama135m`, a random Llama of SmolLM2-135M's
  shape with a 49,152-token vocabulary, 64-token completions.
- `trl_rloo`: TRL's RLOOTrainer in a child run by --trl_python (a separate environment with trl installed; trl is never
  a dependency of this project), configured like rloo.py: same model folder and tokenizer, the same train prompts,
  rewards.accuracy_reward, num_generations 4, per_device_train_batch_size 32 (TRL counts completions), β 0.05, the
  same completion length, temperature 1, num_iterations 1, rloo.py's learning rate, schedule and warm-up, AdamW, and
  TRL's CPU-unfriendly defaults turned off (bf16 and gradient_checkpointing default to True in TRL 1.16). Its step time
  is the wall clock (and CPU time) from on_step_begin to on_step_end of a TrainerCallback.
- Threads: each child runs with OMP_NUM_THREADS=--num_threads (default 1). On a machine shared with other jobs,
  PyTorch's default of one thread per core collapses when another process takes a core; 0 leaves it unset.
- --logprob_gap, instead of training runs: how far, under --bf16, the log-probs the sampler draws with (generate under
  bf16 autocast) are from those training computes (a forward pass under bf16 autocast) and from float32.

Run from the repository root:

    python benchmarks/bench.py                       # all four, both configs (~15 min on a 2-core CPU)
    python benchmarks/bench.py --algorithms rloo,trl_rloo --repeats 3 --trl_python /path/to/trl-venv/bin/python
"""

import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from transformers import HfArgumentParser

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))  # the scripts, common.py and rewards.py
EMBEDDED = str(ROOT / "models" / "tiny-arith")
PROMPTS = ROOT / "data" / "arithmetic" / "train.jsonl"
ALGORITHMS = ("rloo", "grpo", "reinforce", "ppo", "trl_rloo")  # trl_rloo: TRL's RLOOTrainer
GROUPED = {"rloo", "grpo", "trl_rloo"}  # prompts × num_generations; the others sample one completion per prompt
CONFIGS = {"embedded": 24, "random30m": 64, "llama135m": 64}  # config → max_completion_length
PRECISIONS = ("fp32", "bf16")  # bf16: the scripts' --bf16, TRL's bf16=True
RANDOM_MODEL = dict(
    hidden_size=512, intermediate_size=1536, num_hidden_layers=10, num_attention_heads=8, num_key_value_heads=4
)
# the architecture of a popular ~135M chat model (SmolLM2-135M-Instruct's config), randomly initialized
LLAMA_135M = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    vocab_size=49152,
    tie_word_embeddings=True,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
)


def arg(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass
class Args:
    algorithms: str = arg(
        "rloo,grpo,reinforce,ppo",
        "comma-separated: rloo, grpo, reinforce, ppo, trl_rloo (TRL's RLOOTrainer, needs --trl_python)",
    )
    configs: str = arg(
        "embedded,random30m",
        "comma-separated: embedded (models/tiny-arith), random30m (a random 31.7M Qwen2, 64-token completions), "
        "llama135m (a random 135M Llama with a 49,152-token vocabulary, 64-token completions)",
    )
    precisions: str = arg(
        "fp32", "comma-separated: fp32, bf16 (the scripts' --bf16; TRL's bf16=True); every algorithm runs in each"
    )
    steps: int = arg(8, "training steps per run, warm-up included")
    warmup_steps: int = arg(2, "first steps of each run left out of the median (caches, first-call overheads)")
    repeats: int = arg(1, "runs per config and algorithm, interleaved; the table shows the median over runs")
    completions_per_step: int = arg(32, "completions per step, for every algorithm")
    num_generations: int = arg(4, "completions per prompt for rloo, grpo and trl_rloo (reinforce and ppo: 1)")
    beta: float = arg(0.05, "KL coefficient for every algorithm (ppo: --kl_coef)")
    max_completion_length: int = arg(0, "max generated tokens per completion (0: the config's, 24 embedded, else 64)")
    script_flags: str = arg(
        "", "extra flags for every algorithm script, with '=': --script_flags='--use_peft --bf16' (not for trl_rloo)"
    )
    num_threads: int = arg(1, "OMP_NUM_THREADS in each child (0: leave unset, PyTorch's default of one per core)")
    trl_python: str = arg(sys.executable, "python of an environment with trl installed, for trl_rloo")
    logprob_gap: bool = arg(
        False, "instead of training runs: how far the bf16 sampler's log-probs are from training's, on each config"
    )
    work_dir: str = arg("outputs/bench", "where the runs, the random models and the prompt file go")
    output_json: str = arg("outputs/bench/bench.json", "the figures for machines: settings, every run and the summary")


class BadInput(Exception):
    """A bad flag: one line, exit status 2, nothing written."""


def require(condition: bool, message: str):
    if not condition:
        raise BadInput(message)


def fail(message: str):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def flag_message(message: str) -> str:
    """argparse's "argument --max_steps/--max-steps: invalid int value: 'x'" as "--max_steps: invalid int ..."."""
    return re.sub(r"^argument (--[^/:]+)(/[^:]*)?: ", r"\1: ", message)


def parse_args(args_class, argv: list[str] | None = None):
    """`args_class` (bench.py's or compare.py's flags) from the command line; a bad flag is one line."""
    parser = HfArgumentParser(args_class, allow_abbrev=False)
    parser.error = lambda message: fail(flag_message(message))
    return args_class(**vars(parser.parse_args(argv)))


def split_list(text: str, kind=str) -> list:
    return [kind(item.strip()) for item in text.split(",") if item.strip()]


def read_metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def read_prompts(count: int) -> list:
    return [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines()[:count]]


# ----------------------------------------------------------------------------------------------------------------------
# Children: one training run each. `child` runs in the child process, after the parent set its threads and environment.
# ----------------------------------------------------------------------------------------------------------------------
def peak_rss_mb() -> float:
    """This process's own peak resident set size: Linux's VmHWM (its getrusage counts the parent's too, from the fork),
    else ru_maxrss."""
    status = Path("/proc/self/status")
    lines = status.read_text().splitlines() if status.exists() else []
    kib = [int(line.split()[1]) for line in lines if line.startswith("VmHWM:")]
    return (kib[0] if kib else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024  # Linux reports KiB


def child(spec_json: str):
    """Import the script (or TRL), note the RSS after imports, train, write bench_child.json next to metrics.jsonl."""
    spec = json.loads(spec_json)
    run_dir = Path(spec["output_dir"])
    report = {}
    try:
        (trl_run if spec["algorithm"] == "trl_rloo" else script_run)(spec, report)
    finally:
        import torch

        report["peak_rss_mb"] = peak_rss_mb()
        if torch.cuda.is_available():
            report["cuda_max_allocated_mb"] = torch.cuda.max_memory_allocated() / 2**20
        (run_dir / "bench_child.json").write_text(json.dumps(report))


def script_run(spec: dict, report: dict):
    """The script as `python <algorithm>.py argv` runs it, with the process's CPU time noted at each step's record (the
    script's own `log`, wrapped)."""
    import importlib

    from rewards import RewardError

    module = importlib.import_module(spec["algorithm"])
    report["baseline_rss_mb"] = peak_rss_mb()
    cpu_times = report["cpu_times"] = []
    log = module.log

    def timed_log(accelerator, args, step, metrics):
        if "step_time" in metrics:
            cpu_times.append(time.process_time())
        return log(accelerator, args, step, metrics)

    module.log = timed_log
    sys.argv = [f"{spec['algorithm']}.py", *spec["argv"]]
    try:
        module.main(module.parse_args(module.Args))
    except (module.BadInput, RewardError) as error:
        module.fail(str(error))


def trl_run(spec: dict, report: dict):
    import torch
    import trl
    from datasets import load_dataset
    from transformers import TrainerCallback
    from trl import RLOOConfig, RLOOTrainer

    from rewards import accuracy_reward

    report["baseline_rss_mb"] = peak_rss_mb()
    report["trl_version"] = trl.__version__
    step_times, report["step_cpu_times"] = [], []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start, self.cpu_start = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kwargs):
            step_times.append(time.perf_counter() - self.start)
            report["step_cpu_times"].append(time.process_time() - self.cpu_start)

    # rloo.py's learning rate, schedule and optimizer; bf16 as asked (TRL's default is on), no gradient checkpointing
    config = RLOOConfig(
        output_dir=spec["output_dir"],
        max_steps=spec["steps"],
        per_device_train_batch_size=spec["completions_per_step"],
        gradient_accumulation_steps=1,
        num_generations=spec["num_generations"],
        beta=spec["beta"],
        max_completion_length=spec["max_completion_length"],
        temperature=1.0,
        num_iterations=1,
        learning_rate=spec["learning_rate"],
        lr_scheduler_type=spec["lr_scheduler_type"],
        warmup_steps=spec["warmup_ratio"],  # below 1: a fraction of the steps
        optim="adamw_torch",
        max_grad_norm=1.0,
        seed=0,
        logging_steps=1,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        bf16=spec["bf16"],
        use_cpu=not torch.cuda.is_available(),  # transformers allows bf16 on a CPU only with use_cpu
        gradient_checkpointing=False,
        disable_tqdm=True,
    )
    trainer = RLOOTrainer(
        model=spec["model"],
        reward_funcs=accuracy_reward,
        args=config,
        train_dataset=load_dataset("json", data_files=str(PROMPTS), split="train"),
        callbacks=[StepTimer()],
    )
    trainer.train()
    lengths = [log["completions/mean_length"] for log in trainer.state.log_history if "completions/mean_length" in log]
    with open(Path(spec["output_dir"]) / "metrics.jsonl", "w") as f:  # the scripts' format, so one parser reads both
        for step, (step_time, length) in enumerate(zip(step_times, lengths), 1):
            f.write(json.dumps({"step": step, "step_time": step_time, "completions/mean_length": length}) + "\n")


# ----------------------------------------------------------------------------------------------------------------------
# Parent: build the inputs, run the children one at a time, summarize.
# ----------------------------------------------------------------------------------------------------------------------
def build_random_model(path: Path) -> int:
    """A randomly initialized Qwen2 of RANDOM_MODEL's shape with the embedded tokenizer, saved to `path`; returns its
    parameter count."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config

    embedded = Qwen2Config.from_pretrained(EMBEDDED)
    config = Qwen2Config(
        **RANDOM_MODEL,
        vocab_size=embedded.vocab_size,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=embedded.eos_token_id,
        pad_token_id=embedded.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(EMBEDDED).save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def build_llama135m(path: Path) -> int:
    """A randomly initialized Llama of LLAMA_135M's shape (134.5M parameters) saved to `path` with a 49,152-entry
    tokenizer; returns its parameter count.

    The tokenizer is the embedded byte-level BPE (361 entries: the same special tokens and chat template as the real
    model's) extended to 49,152 entries by merges of byte pairs, so that every id the random model samples decodes to
    text and the prompts still tokenize; no download, no corpus. The compute depends on the vocabulary's size, not on
    which strings it holds."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

    import common

    tokenizer = common.load_tokenizer(EMBEDDED)
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab, merges = spec["model"]["vocab"], spec["model"]["merges"]
    byte_chars = [c for c in vocab if len(c) == 1][:256]  # the byte-level alphabet (one character per byte)
    for a in byte_chars:
        for b in byte_chars:
            if len(vocab) == LLAMA_135M["vocab_size"]:
                break
            if a + b not in vocab:
                vocab[a + b] = len(vocab)
                merges.append([a, b])
    assert len(vocab) == LLAMA_135M["vocab_size"], f"tokenizer: {len(vocab)} entries"
    big = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
        eos_token=tokenizer.eos_token,
        pad_token=tokenizer.pad_token,
        unk_token=tokenizer.unk_token,
        padding_side="left",
    )
    big.chat_template = tokenizer.chat_template
    config = LlamaConfig(
        **LLAMA_135M, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(path)
    big.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def logprob_gap(model_path: str, args: Args, length: int) -> dict:
    """How far, under --bf16, the log-probs the sampler draws with (`generate` of the float32 policy under bf16
    autocast, as the scripts sample) are from those training computes (a forward pass of the same policy under bf16
    autocast: π_θ_old and the KL's log π) and from pure float32, on one step's batch of completions. Per token: the mean
    and largest |Δ log π|; per completion: the spread of Σ_t Δ log π, the log of the sequence-level importance ratio
    that a sampler/learner mismatch would put in the loss."""
    from types import SimpleNamespace

    import torch
    from transformers import AutoModelForCausalLM

    import common
    import rloo

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = common.load_tokenizer(model_path)
    policy = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device).eval()
    G = args.num_generations
    texts = [common.prompt_text(tokenizer, p) for p in read_prompts(args.completions_per_step // G) for _ in range(G)]
    sampling = SimpleNamespace(temperature=1.0, top_p=1.0, top_k=0, max_completion_length=length)
    generation_config = common.sampling_config(policy, tokenizer, sampling)
    torch.manual_seed(0)
    with torch.autocast(device, dtype=torch.bfloat16):
        out = common.generate(policy, tokenizer, texts, generation_config, sampler_logprobs=True)
    mask, _ = common.end_of_completion(out["completion_ids"], generation_config.eos_token_id)
    completion_ids = out["completion_ids"].masked_fill(mask == 0, tokenizer.pad_token_id)
    input_ids = torch.cat([out["prompt_ids"], completion_ids], 1)
    attention_mask = torch.cat([out["prompt_mask"], mask], 1)
    T = completion_ids.shape[1]
    with torch.no_grad():
        with torch.autocast(device, dtype=torch.bfloat16):
            autocast = rloo.completion_logprobs(policy, input_ids, attention_mask, T, 1.0)[0]
        fp32 = rloo.completion_logprobs(policy, input_ids, attention_mask, T, 1.0)[0]
    sampled = out["sampler_logprobs"]

    def gap(a, b) -> dict:
        delta = (a - b) * mask
        sequence = delta.sum(1)
        return {
            "token_abs_mean": (delta.abs().sum() / mask.sum()).item(),
            "token_abs_max": delta.abs().max().item(),
            "sequence_mean": sequence.mean().item(),
            "sequence_std": sequence.std().item(),
            "sequence_abs_max": sequence.abs().max().item(),
        }

    return {
        "completions": len(texts),
        "mean_length": mask.sum(1).float().mean().item(),
        "mean_token_logprob": ((fp32 * mask).sum() / mask.sum()).item(),
        "sampler_vs_autocast": gap(sampled, autocast),
        "sampler_vs_fp32": gap(sampled, fp32),
        "autocast_vs_fp32": gap(autocast, fp32),
    }


def script_argv(
    args: Args, algorithm: str, model: str, data_file: Path, length: int, run_dir: Path, precision: str
) -> list[str]:
    G = args.num_generations if algorithm in GROUPED else 1
    argv = [
        "--model_name_or_path",
        model,
        "--dataset_name",
        str(data_file),
        "--max_completion_length",
        str(length),
        "--max_steps",
        str(args.steps),
        "--logging_steps",
        "1",
        "--eval_steps",
        "0",
        "--save_steps",
        "0",
        "--output_dir",
        str(run_dir),
        "--overwrite_output_dir",
        "--prompts_per_step",
        str(args.completions_per_step // G),
    ] + (["--bf16"] if precision == "bf16" else [])
    argv += args.script_flags.split()
    if algorithm == "ppo":
        return argv + ["--kl_coef", str(args.beta)]
    return argv + ["--num_generations", str(G), "--beta", str(args.beta)]


def run_child(args: Args, spec: dict, run_dir: Path) -> dict:
    """One training run in a child process; returns its figures."""
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT)])
    if args.num_threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(args.num_threads)
    python = args.trl_python if spec["algorithm"] == "trl_rloo" else sys.executable
    code = "import sys, bench; bench.child(sys.argv[1])"
    start = time.perf_counter()
    with open(run_dir / "log.txt", "w") as log:
        command = [python, "-c", code, json.dumps(spec)]
        process = subprocess.run(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    if process.returncode != 0:
        tail = (run_dir / "log.txt").read_text().strip().splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(
            f"{spec['algorithm']} exited with status {process.returncode}: {tail[0]} (log: {run_dir / 'log.txt'})"
        )
    records = [r for r in read_metrics(run_dir) if "step_time" in r]
    measured = records[args.warmup_steps :]
    step_times = [r["step_time"] for r in measured]
    tokens = [r["completions/mean_length"] * args.completions_per_step for r in measured]  # real tokens, up to EOS
    child_report = json.loads((run_dir / "bench_child.json").read_text())
    median_step_time = statistics.median(step_times)
    if "cpu_times" in child_report:  # one step's CPU time: from the previous step's record to its own
        marks = child_report["cpu_times"]
        child_report["step_cpu_times"] = [None] + [b - a for a, b in zip(marks, marks[1:])]
    step_cpu_times = [t for t in child_report["step_cpu_times"][args.warmup_steps :] if t is not None]
    peak_rss = child_report["peak_rss_mb"]
    return {
        "median_step_time_s": median_step_time,
        "median_step_cpu_time_s": statistics.median(step_cpu_times) if step_cpu_times else None,
        "completions_per_s": args.completions_per_step / median_step_time,
        "generated_tokens_per_s": statistics.median(n / t for n, t in zip(tokens, step_times)),
        "mean_completion_length": statistics.mean(r["completions/mean_length"] for r in measured),
        "peak_rss_mb": peak_rss,
        "baseline_rss_mb": child_report["baseline_rss_mb"],
        "rss_above_baseline_mb": peak_rss - child_report["baseline_rss_mb"],
        "cuda_max_allocated_mb": child_report.get("cuda_max_allocated_mb"),
        "step_times_s": [r["step_time"] for r in records],
        "wall_s": time.perf_counter() - start,
        **({"trl_version": child_report["trl_version"]} if "trl_version" in child_report else {}),
    }


FIGURES = [
    "median_step_time_s",
    "median_step_cpu_time_s",
    "completions_per_s",
    "generated_tokens_per_s",
    "mean_completion_length",
    "peak_rss_mb",
    "baseline_rss_mb",
    "rss_above_baseline_mb",
    "cuda_max_allocated_mb",
]


def summarize(runs: list[dict]) -> list[dict]:
    """The median of each figure over the repeats of a (config, algorithm)."""
    summary = []
    for key in dict.fromkeys((r["config"], r["algorithm"], r["precision"]) for r in runs):
        group = [r for r in runs if (r["config"], r["algorithm"], r["precision"]) == key]
        row = {
            "config": key[0],
            "algorithm": key[1],
            "precision": key[2],
            "repeats": len(group),
            "parameters": group[0]["parameters"],
        }
        for name in FIGURES:
            values = [r[name] for r in group if r[name] is not None]
            row[name] = statistics.median(values) if values else None
        summary.append(row)
    return summary


def print_table(summary: list[dict], cuda: bool):
    header = [
        "config",
        "algorithm",
        "precision",
        "runs",
        "step time (s)",
        "CPU s/step",
        "completions/s",
        "gen tokens/s",
        "mean length",
        "peak RSS (MB)",
        "RSS above imports (MB)",
    ] + (["CUDA max allocated (MB)"] if cuda else [])
    rows = [
        [
            r["config"],
            r["algorithm"],
            r["precision"],
            str(r["repeats"]),
            f"{r['median_step_time_s']:.3f}",
            "-" if r["median_step_cpu_time_s"] is None else f"{r['median_step_cpu_time_s']:.3f}",
            f"{r['completions_per_s']:.1f}",
            f"{r['generated_tokens_per_s']:.0f}",
            f"{r['mean_completion_length']:.1f}",
            f"{r['peak_rss_mb']:.0f}",
            f"{r['rss_above_baseline_mb']:.0f}",
        ]
        + ([f"{r['cuda_max_allocated_mb']:.0f}"] if cuda else [])
        for r in summary
    ]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")


def main(args: Args):
    algorithms, configs, precisions = split_list(args.algorithms), split_list(args.configs), split_list(args.precisions)
    for name in precisions:
        require(name in PRECISIONS, f"--precisions: unknown precision {name!r} (choose from {', '.join(PRECISIONS)})")
    for name in algorithms:
        require(name in ALGORITHMS, f"--algorithms: unknown algorithm {name!r} (choose from {', '.join(ALGORITHMS)})")
    for name in configs:
        require(name in CONFIGS, f"--configs: unknown config {name!r} (choose from {', '.join(CONFIGS)})")
    require(
        bool(algorithms) and bool(configs) and bool(precisions), "--algorithms, --configs, --precisions: nothing to run"
    )
    require(
        args.steps > args.warmup_steps >= 0,
        f"--steps: {args.steps} leaves no measured step after --warmup_steps {args.warmup_steps}",
    )
    require(args.repeats >= 1, f"--repeats: must be ≥ 1, got {args.repeats}")
    require(args.num_generations >= 2, f"--num_generations: RLOO and GRPO need at least 2, got {args.num_generations}")
    require(
        args.completions_per_step % args.num_generations == 0,
        f"--completions_per_step: {args.completions_per_step} is not a multiple of --num_generations "
        f"{args.num_generations}",
    )
    require(args.max_completion_length >= 0, f"--max_completion_length: must be ≥ 0, got {args.max_completion_length}")
    if "trl_rloo" in algorithms:
        found = (
            Path(args.trl_python).exists()
            and subprocess.run([args.trl_python, "-c", "import trl"], capture_output=True).returncode == 0
        )
        require(
            found,
            f"--trl_python: {args.trl_python} cannot import trl; install it in a separate environment (pip install "
            "'trl==1.16.*') and pass its python",
        )

    import torch
    from transformers import AutoModelForCausalLM

    work_dir = Path(args.work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    data_file = work_dir / "arithmetic_train.jsonl"  # the train split alone: no test split, so no evaluation
    shutil.copyfile(PROMPTS, data_file)
    models = {"embedded": (EMBEDDED, AutoModelForCausalLM.from_pretrained(EMBEDDED).num_parameters())}
    if "random30m" in configs:
        models["random30m"] = (str(work_dir / "random30m"), build_random_model(work_dir / "random30m"))
    if "llama135m" in configs:
        models["llama135m"] = (str(work_dir / "llama135m"), build_llama135m(work_dir / "llama135m"))

    if args.logprob_gap:
        if args.num_threads:
            torch.set_num_threads(args.num_threads)
        gaps = {
            config: logprob_gap(models[config][0], args, args.max_completion_length or CONFIGS[config])
            for config in configs
        }
        for config, result in gaps.items():
            print(
                f"{config}: {result['completions']} completions, mean length {result['mean_length']:.1f}, mean log π "
                f"{result['mean_token_logprob']:.3f}"
            )
            for pair in ("sampler_vs_autocast", "sampler_vs_fp32", "autocast_vs_fp32"):
                g = result[pair]
                print(
                    f"  {pair:>19}: |Δ log π| per token mean {g['token_abs_mean']:.5f} max {g['token_abs_max']:.4f}; "
                    f"Σ_t Δ per completion mean {g['sequence_mean']:+.4f} std {g['sequence_std']:.4f} max |·| "
                    f"{g['sequence_abs_max']:.4f}"
                )
        Path(args.output_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output_json).write_text(json.dumps({"settings": asdict(args), "logprob_gap": gaps}, indent=1))
        print(f"wrote {args.output_json}")
        return

    schedule = {}
    if "trl_rloo" in algorithms:  # TRL trains with rloo.py's learning rate, schedule and warm-up
        import rloo

        defaults = rloo.Args()
        schedule = dict(learning_rate=defaults.learning_rate, warmup_ratio=defaults.warmup_ratio)
        schedule["lr_scheduler_type"] = getattr(defaults.lr_scheduler_type, "value", defaults.lr_scheduler_type)
    runs = []
    for repeat in range(args.repeats):
        for config in configs:
            model, parameters = models[config]
            length = args.max_completion_length or CONFIGS[config]
            for algorithm, precision in [(a, p) for a in algorithms for p in precisions]:
                run_dir = work_dir / f"{config}-{algorithm}-{precision}-{repeat}"
                G = args.num_generations if algorithm in GROUPED else 1
                spec = {
                    "algorithm": algorithm,
                    "output_dir": str(run_dir),
                    "model": model,
                    "steps": args.steps,
                    "completions_per_step": args.completions_per_step,
                    "num_generations": G,
                    "beta": args.beta,
                    "max_completion_length": length,
                    "bf16": precision == "bf16",
                    "argv": script_argv(args, algorithm, model, data_file, length, run_dir, precision),
                    **schedule,
                }
                result = run_child(args, spec, run_dir)
                runs.append(
                    {
                        "config": config,
                        "algorithm": algorithm,
                        "precision": precision,
                        "repeat": repeat,
                        "parameters": parameters,
                        "max_completion_length": length,
                        **result,
                    }
                )
                print(
                    f"[{repeat + 1}/{args.repeats}] {config:>9} {algorithm:>9} {precision}: "
                    f"{result['median_step_time_s']:.3f} s/step, "
                    f"peak RSS {result['peak_rss_mb']:.0f} MB ({result['wall_s']:.0f} s)",
                    flush=True,
                )

    summary = summarize(runs)
    cuda = torch.cuda.is_available()
    print_table(summary, cuda)
    machine = {
        "device": torch.cuda.get_device_name() if cuda else f"cpu ({os.cpu_count()} cores)",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "load_average_at_end": os.getloadavg(),
    }
    Path(args.output_json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output_json).write_text(
        json.dumps({"settings": asdict(args), "machine": machine, "summary": summary, "runs": runs}, indent=1)
    )
    print(f"wrote {args.output_json}")


def cli(argv: list[str] | None = None):
    """`python benchmarks/bench.py argv`: a bad flag is one line `error: ...` on stderr, exit status 2."""
    try:
        main(parse_args(Args, argv))
    except BadInput as error:
        fail(str(error))


if __name__ == "__main__":
    cli()
