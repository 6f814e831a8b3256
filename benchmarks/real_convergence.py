"""One rloo.py run on the real model until held-out gold stops rising: results/real_convergence.{json,png}.

rloo.py from benchmarks/compare_real.py's SFT checkpoint of SmolLM2-135M-Instruct, with the exact-match reward
(`accuracy`, the gold itself) instead of the reward model, evaluated on the 78 held-out prompts every --eval_steps:
4 samples per prompt at T = 1, and one greedy. From the repository root, after compare_real.py's SFT stage:

    python benchmarks/real_convergence.py
    python benchmarks/real_convergence.py --rloo_args "--max_steps 4 --eval_steps 2" --output_dir /tmp/c  # a smoke test
"""

import json
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure

from bench import BadInput, arg, fail, parse_args, read_metrics
from compare import SAMPLES, run_script, sequence_kl

RLOO_ARGS = "--bf16 --num_generations 4 --prompts_per_step 4 --learning_rate 1e-5 --max_steps 60"
RLOO_ARGS += " --eval_steps 10 --save_steps 0"


@dataclass
class Args:
    model_name_or_path: str = arg("outputs/real/sft", "compare_real.py's SFT checkpoint")
    rloo_args: str = arg(RLOO_ARGS, "rloo.py's flags")
    output_dir: str = arg("outputs/real/convergence", "the run")
    report: str = arg("results/real_convergence", "the curve's path, without .json or .png")


def main(args: Args, command: str):
    start = time.perf_counter()
    flags = [*shlex.split(args.rloo_args), "--model_name_or_path", args.model_name_or_path]
    flags += ["--output_dir", args.output_dir, "--overwrite_output_dir"]
    run = run_script("rloo.py", flags, "[rloo.py]")
    run["wall_time_s"] = time.perf_counter() - start
    write_report(args, command, flags, run)


def write_report(args: Args, command: str, flags: list[str], run: dict):
    """The run's held-out gold and KL against completions sampled, with its start, best and end."""
    records = read_metrics(args.output_dir)
    config = json.loads((Path(args.output_dir) / "args.json").read_text())
    C = config["prompts_per_step"] * config["num_generations"]  # completions per step
    evals = [r for r in records if "eval/accuracy" in r]
    train = [r for r in records if "kl" in r and "step_time" in r]
    curve = {
        "completions": [r["step"] * C for r in evals],
        "gold": [r["eval/accuracy"] for r in evals],
        "gold_greedy": [r["eval/accuracy_greedy"] for r in evals],
        "kl_completions": [r["step"] * C for r in train],
        "kl": [sequence_kl(r) for r in train],
    }
    best = max(range(len(evals)), key=lambda i: curve["gold"][i])
    summary = {"start": curve["gold"][0], "best": curve["gold"][best], "end": curve["gold"][-1]}
    summary |= {"best_at_completions": curve["completions"][best]}
    summary |= {f"{k}_greedy": curve["gold_greedy"][i] for k, i in (("start", 0), ("end", -1))}
    report = {"command": command, "rloo_command": shlex.join(["python", "rloo.py", *flags])}
    report |= {"wall_time_s": run["wall_time_s"], "peak_mib": run["peak_mib"]}
    report |= {"summary": summary, "curve": curve}
    path = Path(args.report)
    path.with_suffix(".json").write_text(json.dumps(report, indent=1))
    figure = Figure(figsize=(11, 4.2))
    left, right = figure.subplots(1, 2)
    left.plot(
        curve["completions"],
        curve["gold"],
        "o-",
        markersize=3,
        label="sampled (T = 1, 4 per prompt)",
    )
    left.plot(curve["completions"], curve["gold_greedy"], "s--", markersize=3, label="greedy")
    left.set(xlabel=SAMPLES, ylabel="held-out exact-match accuracy (gold)")
    left.set_title("rloo.py on SmolLM2-135M-Instruct after SFT, exact-match reward")
    left.legend(fontsize=8)
    right.plot(curve["kl_completions"], curve["kl"], color="C2")
    right.set(xlabel=SAMPLES, ylabel="KL to the SFT model, training batch (nats)")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path.with_suffix(".png"), dpi=120)
    print(
        f"gold {summary['start']:.3f} → best {summary['best']:.3f} → end {summary['end']:.3f}; wrote {path}.json"
    )


def cli(argv: list[str] | None = None):
    """`python benchmarks/real_convergence.py argv`: a bad flag is one line `error: ...`, exit status 2."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        main(
            parse_args(Args, argv), shlex.join(["python", "benchmarks/real_convergence.py", *argv])
        )
    except BadInput as error:
        fail(str(error))


if __name__ == "__main__":
    cli()
