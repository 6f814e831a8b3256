"""Benchmark: step time, throughput and peak memory of rloo.py, grpo.py, reinforce.py and ppo.py, and optionally of
TRL's RLOOTrainer on the identical model and batch; with --phases, where a step's time goes and what bounds it.
docs/benchmarks.md says what each figure is, how it is measured, and shows them.

Each (config, algorithm, repeat) is one training run in a child process: the script, unchanged, as `python
<algorithm>.py` runs it, with --logging_steps 1, no checkpoints and no evaluation. Runs go repeat by repeat, so a
background load hits every algorithm alike; the tables show medians over repeats. The child uses no name of the
script's: it hooks the libraries the scripts call (install_hooks). Every script gets 32 completions per step and
β = 0.05; trl_rloo runs TRL in a separate environment (--trl_python), configured like rloo.py (trl_run).

    python benchmarks/bench.py                       # all four on the embedded model
    python benchmarks/bench.py --algorithms rloo,trl_rloo --repeats 3 --trl_python /path/to/trl-venv/bin/python
"""

import collections
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
import timeit
from dataclasses import asdict, dataclass, field
from pathlib import Path

from transformers import HfArgumentParser

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))  # the scripts, common.py and rewards.py
EMBEDDED = str(ROOT / "models" / "tiny-arith")
PROMPTS = ROOT / "data" / "arithmetic" / "train.jsonl"
ALGORITHMS = ("rloo", "grpo", "reinforce", "ppo", "trl_rloo")  # trl_rloo: TRL's RLOOTrainer
GROUPED = {
    "rloo",
    "grpo",
    "trl_rloo",
}  # prompts × num_generations; the others sample one completion per prompt
CONFIGS = {"embedded": 24, "llama135m": 64, "qwen0.5b": 64}  # config → max_completion_length
PRECISIONS = ("fp32", "bf16")  # bf16: the scripts' --bf16, TRL's bf16=True
PHASES = ("generation", "policy forward", "reference forward", "backward", "optimizer")  # --phases
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
# Qwen2.5-0.5B's shape (its 151,936-row embedding; the tokenizer has 49,152 entries, as Qwen's has fewer than its rows)
QWEN_05B = dict(
    hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14
)
QWEN_05B |= dict(
    num_key_value_heads=2, vocab_size=151936, attention_bias=True, rope_theta=1000000.0
)
SHAPES = {"llama135m": LLAMA_135M, "qwen0.5b": LLAMA_135M | QWEN_05B}
# rloo.py's defaults, which trl_rloo trains with (tests/test_bench.py checks them)
RLOO_SCHEDULE = dict(learning_rate=2e-4, lr_scheduler_type="cosine", warmup_ratio=0.03)


def arg(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass
class Args:
    algorithms: str = arg("rloo,grpo,reinforce,ppo", "comma-separated, of ALGORITHMS")
    configs: str = arg("embedded", "comma-separated: embedded, llama135m, qwen0.5b (SHAPES)")
    precisions: str = arg("fp32", "comma-separated: fp32, bf16 (--bf16; TRL's bf16=True)")
    steps: int = arg(8, "training steps per run, warm-up included")
    warmup_steps: int = arg(2, "first steps of each run left out of the median")
    repeats: int = arg(1, "runs per config and algorithm, interleaved; the table shows medians")
    completions_per_step: int = arg(32, "completions per step, for every algorithm")
    num_generations: int = arg(4, "completions per prompt for rloo, grpo and trl_rloo")
    beta: float = arg(0.05, "KL coefficient for every algorithm (ppo: --kl_coef)")
    max_completion_length: int = arg(0, "0: the config's (CONFIGS)")
    script_flags: str = arg("", "extra flags for every script: --script_flags='--use_peft --bf16'")
    num_threads: int = arg(1, "OMP_NUM_THREADS in each child (0: PyTorch's one per core)")
    trl_python: str = arg(sys.executable, "python of an environment with trl, for trl_rloo")
    phases: bool = arg(False, "also each phase of a step and its bound")
    work_dir: str = arg("outputs/bench", "where the runs, the random models and the prompts go")
    output_json: str = arg("outputs/bench/bench.json", "settings, every run and the summary")


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
    return [
        json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    ]


# ----------------------------------------------------------------------------------------------------------------------
# Children: one training run each. `child` runs in the child process, after the parent set its threads and environment.
# ----------------------------------------------------------------------------------------------------------------------
def peak_rss_mb() -> float:
    """This process's own peak resident set size: Linux's VmHWM (getrusage counts the parent's too, from the fork)."""
    lines = Path("/proc/self/status").read_text().splitlines()
    return [int(line.split()[1]) for line in lines if line.startswith("VmHWM:")][
        0
    ] / 1024  # in KiB


def child(spec_json: str):
    """Install the hooks, run the script (or TRL), write bench_child.json next to metrics.jsonl; then, with --phases,
    measure the bounds (after the peak memory is noted: their buffers are not the run's) and write it again."""
    spec = json.loads(spec_json)
    report_file = Path(spec["output_dir"]) / "bench_child.json"
    report = {}
    try:
        install_hooks(report, spec["phases"])
        (trl_run if spec["algorithm"] == "trl_rloo" else script_run)(spec, report)
    finally:
        import torch

        report["peak_rss_mb"] = peak_rss_mb()
        if torch.cuda.is_available():
            report["cuda_max_allocated_mb"] = torch.cuda.max_memory_allocated() / 2**20
        report_file.write_text(json.dumps(report))
    if spec["phases"]:
        report["bounds"], report["rates"] = phase_bounds(report, spec["bf16"])
        report_file.write_text(json.dumps(report))


def script_run(spec: dict, report: dict):
    """The script as `python <algorithm>.py argv` runs it, after the libraries every script imports."""
    import importlib
    import runpy

    for library in ("torch", "transformers", "accelerate", "datasets"):
        importlib.import_module(library)
    report["baseline_rss_mb"] = peak_rss_mb()
    script = str(ROOT / f"{spec['algorithm']}.py")
    sys.argv = [script, *spec["argv"]]
    runpy.run_path(script, run_name="__main__")
    marks = report["cpu_marks"]  # a step's CPU time: from the previous step's end to its own
    report["step_cpu_times"] = [None] + [b - a for a, b in zip(marks, marks[1:])]


def clock() -> float:
    """The clock of --phases. On a CPU, this process's CPU time: with one thread it is an idle machine's wall clock, and
    other jobs inflate it far less. On CUDA, the wall clock once the GPU's queued work is done."""
    import torch

    if not torch.cuda.is_available():
        return time.process_time()
    torch.cuda.synchronize()
    return time.perf_counter()


def install_hooks(report: dict, phases: bool):
    """Hooks in the libraries: accelerate's `log` notes the CPU time at each step's end (the scripts log `step_time`
    through it); with `phases`, hooks in torch and transformers note each phase of a step in report["steps"]."""
    import accelerate
    import torch
    import transformers
    from torch.nn.modules.module import (
        register_module_forward_hook,
        register_module_forward_pre_hook,
    )
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    steps, cpu_marks, starts = [[]], [], []
    generating = False
    report.update(steps=steps, cpu_marks=cpu_marks)
    log = accelerate.Accelerator.log

    def timed_log(accelerator, values: dict, *args, **kwargs):
        if "step_time" in values:
            cpu_marks.append(time.process_time())
            steps.append([])
        return log(accelerator, values, *args, **kwargs)

    accelerate.Accelerator.log = timed_log
    if not phases:
        return

    def note(phase: str, start: float, model=None, **shapes):
        seconds = clock() - start
        if model is not None:
            shapes |= model_shapes(model)
        steps[-1].append(dict(phase=phase, seconds=seconds, **shapes))

    generate = transformers.GenerationMixin.generate

    def timed_generate(model, *args, **kwargs):
        nonlocal generating
        start = clock()
        generating = True
        output = generate(model, *args, **kwargs)
        generating = False
        B, P = kwargs["input_ids"].shape if "input_ids" in kwargs else args[0].shape
        T = getattr(output, "sequences", output).shape[1] - P
        note("generation", start, model, B=B, P=P, T=T)
        return output

    transformers.GenerationMixin.generate = timed_generate

    def forward_start(module, args):
        if isinstance(module, transformers.PreTrainedModel):
            starts.append(clock())

    def forward_end(module, args, kwargs, output):
        if not isinstance(module, transformers.PreTrainedModel):
            return
        start = starts.pop()
        if starts or generating:  # a model inside another's forward, or inside generate
            return
        trains = any(p.requires_grad for p in module.parameters())
        B, L = kwargs["input_ids"].shape if "input_ids" in kwargs else args[0].shape
        kept = output.logits.shape[1] if hasattr(output, "logits") else 0  # positions with logits
        backward = 0  # how many forwards' worth of work its backward does
        if trains and torch.is_grad_enabled():
            backward = 3 if module.is_gradient_checkpointing else 2
        phase = "policy forward" if trains else "reference forward"
        note(phase, start, module, B=B, L=L, kept=kept, backward=backward)

    register_module_forward_pre_hook(forward_start)
    register_module_forward_hook(forward_end, with_kwargs=True)
    backward = torch.autograd.backward

    def timed_backward(*args, **kwargs):  # loss.backward() and accelerator.backward(loss) call it
        start = clock()
        backward(*args, **kwargs)
        note("backward", start)

    torch.autograd.backward = timed_backward
    optimizer_starts = []
    register_optimizer_step_pre_hook(lambda *_: optimizer_starts.append(clock()))

    def optimizer_end(optimizer, args, kwargs):
        trained = sum(
            p.numel()
            for group in optimizer.param_groups
            for p in group["params"]
            if p.requires_grad
        )
        note("optimizer", optimizer_starts.pop(), parameters=trained)

    register_optimizer_step_post_hook(optimizer_end)


def model_shapes(model) -> dict:
    """What a pass's bound reads of a model: (in, out, count) of its linear layers but the output head, the head's
    (in, out) (None in a model without one), and per position attended and per token cached, the attention's sizes."""
    import torch

    config, head = model.config, model.get_output_embeddings()
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head]
    counts = collections.Counter((m.in_features, m.out_features) for m in linears)
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", heads)
    return {
        "linears": [[i, o, count] for (i, o), count in counts.items()],
        "head": [head.in_features, head.out_features] if head is not None else None,
        "attention": config.num_hidden_layers
        * heads
        * head_dim,  # query·key and the sum of values: 2 FLOPs each
        "cache": 2 * config.num_hidden_layers * kv_heads * head_dim,  # keys and values
    }


def phase_bounds(report: dict, bf16: bool) -> tuple[list[dict], dict]:
    """Each step's bound of each phase, in seconds (--phases says how), at matmul rates and a bandwidth measured now;
    and those rates."""
    import torch

    dtype = torch.bfloat16 if bf16 else torch.float32
    device = "cuda" if torch.cuda.is_available() else "cpu"
    seconds_per_flop = {}

    def best_of_3(
        work,
    ) -> float:  # after a warm-up; on CUDA 10 calls at a time, so that one is not a sync's latency
        calls = 10 if device == "cuda" else 1
        return min(timeit.repeat(work, timer=clock, repeat=4, number=calls)[1:]) / calls

    def matmul_seconds(tokens: int, n_in: int, n_out: int, count: int = 1) -> float:
        """`count` matmuls of (tokens, n_in) by (n_in, n_out), at the rate of that shape."""
        flops = 2 * tokens * n_in * n_out
        if (tokens, n_in, n_out) not in seconds_per_flop:
            x = torch.randn(tokens, n_in, dtype=dtype, device=device)
            w = torch.randn(n_out, n_in, dtype=dtype, device=device)
            seconds_per_flop[tokens, n_in, n_out] = best_of_3(lambda: x @ w.T) / flops
        return count * flops * seconds_per_flop[tokens, n_in, n_out]

    source = torch.empty(2**26, device=device)  # 256 MB of float32
    copy = torch.empty_like(source)
    bandwidth = (
        2 * source.nbytes / best_of_3(lambda: copy.copy_(source))
    )  # bytes read and written per second

    def pass_seconds(shapes: dict, B: int, L: int, past: int, kept: int) -> float:
        """B sequences of L tokens after `past` cached ones, logits at `kept` positions: the larger of its FLOPs' time
        and its bytes' time."""
        linears = sum(matmul_seconds(B * L, i, o, count) for i, o, count in shapes["linears"])
        linear_flops = sum(2 * B * L * i * o * count for i, o, count in shapes["linears"])
        attended = (
            L * past + L * (L + 1) / 2
        )  # each token attends to the cache, to itself and to the ones before
        attention_flops = 4 * B * shapes["attention"] * attended
        head = matmul_seconds(B * kept, *shapes["head"]) if shapes["head"] and kept else 0.0
        compute = (
            linears * (1 + attention_flops / linear_flops) + head
        )  # attention at the linears' mean rate
        weights = sum(i * o * count for i, o, count in shapes["linears"]) + math.prod(
            shapes["head"] or [0]
        )
        cache = B * shapes["cache"] * (past + L)
        return max(compute, (weights + cache) * dtype.itemsize / bandwidth)

    bounds = []
    for events in report["steps"]:
        bound = dict.fromkeys(PHASES, 0.0)
        for event in events:
            if (
                event["phase"] == "generation"
            ):  # a prefill, then one token at a time: the t-th after P + t - 1
                B, P, T = event["B"], event["P"], event["T"]
                decoding = sum(pass_seconds(event, B, 1, P + t - 1, 1) for t in range(1, T))
                bound["generation"] += pass_seconds(event, B, P, 0, 1) + decoding
            elif (
                event["phase"] == "optimizer"
            ):  # AdamW: 4 float32 reads and 3 writes per trained parameter
                bound["optimizer"] += 28 * event["parameters"] / bandwidth
            elif event["phase"] != "backward":
                forward = pass_seconds(event, event["B"], event["L"], 0, event["kept"])
                bound[event["phase"]] += forward
                bound["backward"] += event["backward"] * forward
        bounds.append(bound)
    matmuls = {"x".join(map(str, shape)): 1e-9 / rate for shape, rate in seconds_per_flop.items()}
    return bounds, {
        "copy_GB_per_s": bandwidth / 1e9,
        "matmul_GFLOP_per_s (tokens x in x out)": matmuls,
    }


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
    lengths = [
        log["completions/mean_length"]
        for log in trainer.state.log_history
        if "completions/mean_length" in log
    ]
    with open(
        Path(spec["output_dir"]) / "metrics.jsonl", "w"
    ) as f:  # the scripts' format, so one parser reads both
        for step, (step_time, length) in enumerate(zip(step_times, lengths), 1):
            f.write(
                json.dumps(
                    {"step": step, "step_time": step_time, "completions/mean_length": length}
                )
                + "\n"
            )


# ----------------------------------------------------------------------------------------------------------------------
# Parent: build the inputs, run the children one at a time, summarize.
# ----------------------------------------------------------------------------------------------------------------------
def build_random_model(path: Path, shape: dict) -> int:
    """A randomly initialized Llama of `shape` (llama135m: 134.5M parameters) saved to `path`; returns its parameter
    count. Its tokenizer is the embedded byte-level BPE (the same special tokens and chat template) extended to 49,152
    entries by merges of byte pairs: every id decodes to text, the prompts still tokenize, nothing is downloaded."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

    import common

    tokenizer = common.load_tokenizer(EMBEDDED)
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab, merges = spec["model"]["vocab"], spec["model"]["merges"]
    byte_chars = [c for c in vocab if len(c) == 1][
        :256
    ]  # the byte-level alphabet (one character per byte)
    for a in byte_chars:
        for b in byte_chars:
            if len(vocab) == LLAMA_135M["vocab_size"]:  # 49,152
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
        **shape,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(path)
    big.save_pretrained(path)
    return model.num_parameters()


def script_argv(
    args: Args,
    algorithm: str,
    model: str,
    data_file: Path,
    length: int,
    run_dir: Path,
    precision: str,
) -> list[str]:
    G = args.num_generations if algorithm in GROUPED else 1
    flags = {
        "--model_name_or_path": model,
        "--dataset_name": data_file,
        "--max_completion_length": length,
        "--max_steps": args.steps,
        "--logging_steps": 1,
        "--eval_steps": 0,
        "--save_steps": 0,
        "--output_dir": run_dir,
        "--prompts_per_step": args.completions_per_step // G,
    }
    if algorithm == "ppo":
        flags["--kl_coef"] = args.beta
    else:
        flags |= {"--num_generations": G, "--beta": args.beta}
    argv = [str(item) for flag in flags.items() for item in flag] + ["--overwrite_output_dir"]
    if precision == "bf16":
        argv.append("--bf16")
    return argv + args.script_flags.split()


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
        last = f"{tail[0]} (log: {run_dir / 'log.txt'})"
        raise RuntimeError(f"{spec['algorithm']} exited with status {process.returncode}: {last}")
    records = [r for r in read_metrics(run_dir) if "step_time" in r]
    measured = records[args.warmup_steps :]
    step_times = [r["step_time"] for r in measured]
    tokens = [
        r["completions/mean_length"] * args.completions_per_step for r in measured
    ]  # real tokens, up to EOS
    child_report = json.loads((run_dir / "bench_child.json").read_text())
    median_step_time = statistics.median(step_times)
    step_cpu_times = [
        t for t in child_report["step_cpu_times"][args.warmup_steps :] if t is not None
    ]
    return {
        "median_step_time_s": median_step_time,
        "median_step_cpu_time_s": statistics.median(step_cpu_times) if step_cpu_times else None,
        "completions_per_s": args.completions_per_step / median_step_time,
        "generated_tokens_per_s": statistics.median(n / t for n, t in zip(tokens, step_times)),
        "mean_completion_length": statistics.mean(r["completions/mean_length"] for r in measured),
        "peak_rss_mb": child_report["peak_rss_mb"],
        "baseline_rss_mb": child_report["baseline_rss_mb"],
        "rss_above_baseline_mb": child_report["peak_rss_mb"] - child_report["baseline_rss_mb"],
        "cuda_max_allocated_mb": child_report.get("cuda_max_allocated_mb"),
        "step_times_s": [r["step_time"] for r in records],
        "wall_s": time.perf_counter() - start,
        **({"trl_version": child_report["trl_version"]} if "trl_version" in child_report else {}),
        **(
            {"phases": phase_medians(records, child_report, args.warmup_steps)}
            if args.phases
            else {}
        ),
        "phase_rates": child_report.get("rates"),  # --phases: what the bounds were measured at
    }


def phase_medians(records: list[dict], child_report: dict, warmup_steps: int) -> dict:
    """Each phase's median seconds and bound over the measured steps, in `clock`'s time. The rest: the step's time less
    its phases'; the step: its time (on a CPU its CPU time), and the sum of its phases' bounds."""
    cuda = "cuda_max_allocated_mb" in child_report
    step_seconds = [r["step_time"] for r in records] if cuda else child_report["step_cpu_times"]
    seconds, bounds = [], []
    for step, events, bound in list(
        zip(step_seconds, child_report["steps"], child_report["bounds"])
    )[warmup_steps:]:
        phases = {name: sum(e["seconds"] for e in events if e["phase"] == name) for name in PHASES}
        seconds.append(phases | {"rest": step - sum(phases.values()), "step": step})
        bounds.append(bound | {"rest": None, "step": sum(bound.values())})
    return {
        name: {
            "seconds": median([s[name] for s in seconds]),
            "bound": median([b[name] for b in bounds]),
        }
        for name in seconds[0]
    }


FIGURES = {  # each run's figures, the median over the repeats in the summary: the column and format in the table
    "median_step_time_s": ("step time (s)", "{:.3f}"),
    "median_step_cpu_time_s": ("CPU s/step", "{:.3f}"),
    "completions_per_s": ("completions/s", "{:.1f}"),
    "generated_tokens_per_s": ("gen tokens/s", "{:.0f}"),
    "mean_completion_length": ("mean length", "{:.1f}"),
    "peak_rss_mb": ("peak RSS (MB)", "{:.0f}"),
    "baseline_rss_mb": (None, None),  # in the JSON only
    "rss_above_baseline_mb": ("RSS above imports (MB)", "{:.0f}"),
    "cuda_max_allocated_mb": ("CUDA max allocated (MB)", "{:.0f}"),  # on CUDA only
}


def summarize(runs: list[dict]) -> list[dict]:
    """The median of each figure over the repeats of a (config, algorithm)."""
    summary = []
    for key in dict.fromkeys((r["config"], r["algorithm"], r["precision"]) for r in runs):
        group = [r for r in runs if (r["config"], r["algorithm"], r["precision"]) == key]
        row = dict(
            zip(("config", "algorithm", "precision"), key),
            repeats=len(group),
            parameters=group[0]["parameters"],
        )
        for name in FIGURES:
            row[name] = median([r[name] for r in group])
        for name in group[0].get("phases", {}):  # each phase's medians over the repeats
            figures = [r["phases"][name] for r in group]
            row.setdefault("phases", {})[name] = {
                k: median([f[k] for f in figures]) for k in ("seconds", "bound")
            }
        summary.append(row)
    return summary


def median(values: list):
    """The median of those that are not None; None if none is."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def print_table(summary: list[dict], cuda: bool):
    shown = [
        name
        for name, (column, _) in FIGURES.items()
        if column and (cuda or name != "cuda_max_allocated_mb")
    ]
    print(
        "| config | algorithm | precision | runs | "
        + " | ".join(FIGURES[name][0] for name in shown)
        + " |"
    )
    print("|" + "---|" * (4 + len(shown)))
    for r in summary:
        cells = [r["config"], r["algorithm"], r["precision"], str(r["repeats"])]
        cells += ["-" if r[name] is None else FIGURES[name][1].format(r[name]) for name in shown]
        print("| " + " | ".join(cells) + " |")


def print_phases(row: dict):
    """One run's phases in markdown: median seconds, bound and ratio; the step's bound is the sum of its phases'."""
    unit = "seconds" if row["cuda_max_allocated_mb"] else "CPU seconds"
    wall = f"(the wall clock's step: {row['median_step_time_s']:.3g} s)"
    print(
        f"\n{row['config']}, {row['algorithm']}, {row['precision']}: medians over the measured steps {wall}"
    )
    print(f"| phase | {unit} | bound | ratio |\n|---|---|---|---|")
    for name, figure in row["phases"].items():
        seconds, bound = figure["seconds"], figure["bound"]
        if bound is None:
            print(f"| {name} | {seconds:.3g} | – | – |")
        else:
            print(f"| {name} | {seconds:.3g} | {bound:.3g} | {seconds / bound:.2f}× |")


def main(args: Args):
    algorithms, configs, precisions = (
        split_list(args.algorithms),
        split_list(args.configs),
        split_list(args.precisions),
    )
    for kind, names, known in (
        ("algorithm", algorithms, ALGORITHMS),
        ("config", configs, CONFIGS),
        ("precision", precisions, PRECISIONS),
    ):
        require(bool(names), f"--{kind}s: nothing to run")
        for name in names:
            require(
                name in known,
                f"--{kind}s: unknown {kind} {name!r} (choose from {', '.join(known)})",
            )
    unmeasured = f"{args.steps} leaves no measured step after --warmup_steps {args.warmup_steps}"
    require(args.steps > args.warmup_steps >= 0, f"--steps: {unmeasured}")
    require(args.repeats >= 1, f"--repeats: must be ≥ 1, got {args.repeats}")
    require(
        not (args.phases and "trl_rloo" in algorithms),
        "--phases: for the scripts, not for trl_rloo",
    )
    require(
        args.warmup_steps >= 1 or not args.phases,
        "--phases: needs --warmup_steps ≥ 1 (step 1 has no CPU time)",
    )
    require(
        args.num_generations >= 2,
        f"--num_generations: RLOO and GRPO need at least 2, got {args.num_generations}",
    )
    not_multiple = f"{args.completions_per_step} is not a multiple of --num_generations {args.num_generations}"
    require(
        args.completions_per_step % args.num_generations == 0,
        f"--completions_per_step: {not_multiple}",
    )
    require(
        args.max_completion_length >= 0,
        f"--max_completion_length: must be ≥ 0, got {args.max_completion_length}",
    )
    if "trl_rloo" in algorithms:
        command = [args.trl_python, "-c", "import trl"]
        found = (
            Path(args.trl_python).exists()
            and subprocess.run(command, capture_output=True).returncode == 0
        )
        install = (
            "install it in a separate environment (pip install 'trl==1.16.*') and pass its python"
        )
        require(found, f"--trl_python: {args.trl_python} cannot import trl; {install}")

    import torch
    from transformers import AutoModelForCausalLM

    work_dir = Path(args.work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    data_file = (
        work_dir / "arithmetic_train.jsonl"
    )  # the train split alone: no test split, so no evaluation
    shutil.copyfile(PROMPTS, data_file)
    models = {
        "embedded": (EMBEDDED, AutoModelForCausalLM.from_pretrained(EMBEDDED).num_parameters())
    }
    for config in set(configs) & set(SHAPES):
        models[config] = (
            str(work_dir / config),
            build_random_model(work_dir / config, SHAPES[config]),
        )

    runs = []
    for repeat in range(args.repeats):  # one run of each, then the next
        for config in configs:
            model, parameters = models[config]
            length = args.max_completion_length or CONFIGS[config]
            for algorithm, precision in [(a, p) for a in algorithms for p in precisions]:
                run_dir = work_dir / f"{config}-{algorithm}-{precision}-{repeat}"
                G = args.num_generations if algorithm in GROUPED else 1
                spec = (
                    asdict(args) | RLOO_SCHEDULE
                )  # the child reads its steps, batch, β, --phases
                spec |= dict(
                    algorithm=algorithm, output_dir=str(run_dir), model=model, num_generations=G
                )
                spec |= dict(max_completion_length=length, bf16=precision == "bf16")
                spec["argv"] = script_argv(
                    args, algorithm, model, data_file, length, run_dir, precision
                )
                result = run_child(args, spec, run_dir)
                run = dict(
                    config=config, precision=precision, repeat=repeat, parameters=parameters
                )
                runs.append(
                    run | {"algorithm": algorithm, "max_completion_length": length} | result
                )
                figures = f"{result['median_step_time_s']:.3f} s/step, peak RSS {result['peak_rss_mb']:.0f} MB"
                print(
                    f"[{repeat + 1}/{args.repeats}] {config:>9} {algorithm:>9} {precision}: {figures}",
                    flush=True,
                )

    summary = summarize(runs)
    cuda = torch.cuda.is_available()
    print_table(summary, cuda)
    for row in [r for r in summary if "phases" in r]:
        print_phases(row)
    machine = {
        "device": torch.cuda.get_device_name() if cuda else f"cpu ({os.cpu_count()} cores)",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "load_average_at_end": os.getloadavg(),
    }
    Path(args.output_json).parent.mkdir(parents=True, exist_ok=True)
    report = {"settings": asdict(args), "machine": machine, "summary": summary, "runs": runs}
    Path(args.output_json).write_text(json.dumps(report, indent=1))
    print(f"wrote {args.output_json}")


def cli(argv: list[str] | None = None):
    """`python benchmarks/bench.py argv`: a bad flag is one line `error: ...` on stderr, exit status 2."""
    try:
        main(parse_args(Args, argv))
    except BadInput as error:
        fail(str(error))


if __name__ == "__main__":
    cli()
