"""`make run` over seeds and machines' arithmetic: how much held-out success rises, per seed.

    python -m experiments.make_run_seeds --seeds 0 1 2 3 4                    # the demo as it is
    python -m experiments.make_run_seeds --seeds 0 1 2 3 4 --label before \\
        --sft sft.steps=100                                                  # the demo before issue 46
    python -m experiments.make_run_seeds --seeds 0 1 --label avx2 \\
        --xla-flags=--xla_cpu_max_isa=AVX2                                    # another CPU's arithmetic
    python -m experiments.make_run_seeds --jobs 2 --cores-per-job 1 ...      # two runs at a time
    python -m experiments.make_run_seeds --collect                           # table, plot, results.json

Each run is exactly the two commands of `make run` (`hgpo-jax sft toy_format` then `hgpo-jax train
toy_hgpo model.path=<that run>`), as subprocesses, with `train.seed=<seed>` given to both and the
variant's extra overrides (`--sft`, `--rl`) and `XLA_FLAGS` (`--xla-flags`). A finished run is
kept as OUT/<label>/s<seed>.json: its held-out curve (eval/valid_seen/all per iteration), its
training success, the demo's own summary (first and last third, the change), what the warm start
does on the held-out tasks (`toy_strategy.py`: how many of its actions are not admissible) and
the wall time of each command. Finished runs are skipped when the script runs again; `--collect`
(or the end of any invocation) gathers every OUT/<label>/s*.json into OUT/results.json,
OUT/table.md and OUT/success.png.

--jobs runs several seeds at once, each pinned to its own `--cores-per-job` cores with taskset
(so 8 jobs x 2 cores on a 16-core machine are eight 2-core machines); `--python` picks the
interpreter that runs `hgpo_jax.cli` (the default is this one).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import glob
import json
import os
import platform
import queue
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPLIT = "valid_seen"
NEED = 0.15  # the rise the demo must show (issue 46)
HORIZONS = (10, 15, 20, 30)  # iterations at which collect() also cuts the longer runs


def cpu_name() -> str:
    """The CPU's model name (Linux), else platform.processor()."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def versions(python: str, env: dict) -> str:
    """jax, flax and tokenizers versions and JAX's backend as the run's interpreter sees them."""
    code = ("import jax, flax, tokenizers; print(f'jax {jax.__version__}, flax {flax.__version__}, "
            "tokenizers {tokenizers.__version__}, backend {jax.default_backend()}')")
    out = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def command(python: str, cores: list[int] | None, *args: str) -> list[str]:
    pin = ["taskset", "-c", ",".join(map(str, cores))] if cores and shutil.which("taskset") else []
    return [*pin, python, "-m", "hgpo_jax.cli", *args, "--no-progress"]


def timed(cmd: list[str], env: dict, log: str) -> float:
    """Run cmd with its output appended to log; returns its wall seconds, raises on failure."""
    t0 = time.time()
    with open(log, "a", encoding="utf-8") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        rc = subprocess.call(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    if rc:
        raise RuntimeError(f"{' '.join(cmd)} exited with {rc}; see {log}")
    return time.time() - t0


def read_run(rl_dir: str) -> dict:
    """The held-out and training curves and the demo's summary from a finished RL run folder."""
    from hgpo_jax.metrics import read_metrics

    records = read_metrics(rl_dir)  # one record per iteration, in order
    evaluated = [r for r in records if f"eval/{SPLIT}/all" in r]
    summary = {k.split("/", 2)[2]: v for r in records for k, v in r.items()
               if k.startswith(f"summary/eval_{SPLIT}/")}
    return {"eval": [r[f"eval/{SPLIT}/all"] for r in evaluated],
            "train": [r.get("success/all") for r in evaluated],
            "kl_loss": [r.get("train/kl_loss") for r in evaluated],
            "summary": summary}


def warm_start_profile(python: str, fmt_dir: str, env: dict) -> dict:
    """What the warm start does on the held-out tasks (experiments/toy_strategy.py, 48 tasks once at
    the eval temperature): its success and the share of its actions that are not admissible."""
    out = subprocess.run([python, "-m", "experiments.toy_strategy", fmt_dir,
                          "--samples", "1", "--json", os.path.join(fmt_dir, "strategy.json")],
                         env=env, cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        return {"error": out.stderr[-500:]}
    with open(os.path.join(fmt_dir, "strategy.json"), encoding="utf-8") as f:
        s = json.load(f)[fmt_dir]["summary"]
    return {"success": s["success"][0], "inadmissible_per_turn": s["inadmissible actions per turn"]}


def one_seed(args, seed: int, cores: list[int] | None) -> dict:
    out_json = os.path.join(args.out, args.label, f"s{seed}.json")
    if os.path.isfile(out_json):
        with open(out_json, encoding="utf-8") as f:
            return json.load(f)
    runs = os.path.join(args.runs, args.label)
    os.makedirs(runs, exist_ok=True)
    fmt_dir, rl_dir = os.path.join(runs, f"toy_format-s{seed}"), os.path.join(runs, f"toy_hgpo-s{seed}")
    for d in (fmt_dir, rl_dir):  # an unfinished run starts again from nothing
        shutil.rmtree(d, ignore_errors=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    if args.xla_flags:
        env["XLA_FLAGS"] = " ".join(p for p in (env.get("XLA_FLAGS"), args.xla_flags) if p)
    log = os.path.join(runs, f"s{seed}.log")
    sft_cmd = command(args.python, cores, "sft", "toy_format", f"train.seed={seed}",
                      f"train.run_dir={fmt_dir}", *args.sft)
    rl_cmd = command(args.python, cores, "train", "toy_hgpo", f"model.path={fmt_dir}",
                     f"train.seed={seed}", f"train.run_dir={rl_dir}", *args.rl)
    sft_s = timed(sft_cmd, env, log)
    rl_s = timed(rl_cmd, env, log)
    record = {"label": args.label, "seed": seed, "sft_seconds": round(sft_s, 1),
              "rl_seconds": round(rl_s, 1), "wall_seconds": round(sft_s + rl_s, 1),
              "commands": [" ".join(sft_cmd), " ".join(rl_cmd)], "xla_flags": args.xla_flags,
              "cpu": cpu_name(), "cores": len(cores) if cores else os.cpu_count(),
              "software": versions(args.python, env),
              "platform": env.get("JAX_PLATFORMS", ""), **read_run(rl_dir)}
    if args.profile:
        record["warm_start"] = warm_start_profile(args.python, fmt_dir, env)
    os.makedirs(os.path.dirname(out_json), exist_ok=True)
    with open(out_json, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    print(f"{args.label} seed {seed}: held-out {record['summary'].get('first_third', float('nan')):.3f}"
          f" -> {record['summary'].get('last_third', float('nan')):.3f} "
          f"({record['summary'].get('improvement', float('nan')):+.3f}), {record['wall_seconds']:.0f} s",
          flush=True)
    return record


def thirds(curve: list[float], iterations: int) -> tuple[float, float, float]:
    """(first third, last third, change) of the first `iterations` points, as the trainer's summary
    computes them (thirds of iterations // 3 points; the mean over iterations equals the mean over
    episodes since every iteration evaluates the same 48 tasks)."""
    c = np.asarray(curve[:iterations], float)
    n = max(1, len(c) // 3)
    return float(c[:n].mean()), float(c[-n:].mean()), float(c[-n:].mean() - c[:n].mean())


def wall(r: dict) -> str:
    """'sft + train s' where both commands were timed, else the whole wall time."""
    if r.get("sft_seconds") is None:
        return f"{r['wall_seconds']:.0f} s"
    return f"{r['sft_seconds']:.0f} + {r['rl_seconds']:.0f} s"


def collect(out: str) -> dict:
    """Every OUT/<label>/s*.json into OUT/results.json, OUT/table.md and OUT/success.png."""
    records = []
    for path in sorted(glob.glob(os.path.join(out, "*", "s*.json"))):
        with open(path, encoding="utf-8") as f:
            records.append(json.load(f))
    labels = sorted({r["label"] for r in records})
    lines = ["| variant | seed | machine | held-out first third | last third | **change** | >= +0.15 "
             "| held-out at the last iteration | warm start: inadmissible actions | wall (sft + train) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    per_label = {}
    for label in labels:
        rows = sorted((r for r in records if r["label"] == label), key=lambda r: r["seed"])
        changes = []
        for r in rows:
            first, last, change = thirds(r["eval"], len(r["eval"]))
            changes.append(change)
            ws = r.get("warm_start", {}).get("inadmissible_per_turn")
            machine = r.get("machine") or ", ".join(
                x for x in (r["cpu"], f"{r['cores']} cores", r.get("software")) if x)
            machine += f", XLA_FLAGS={r['xla_flags']}" if r["xla_flags"] else ""
            lines.append(f"| {label} | {r['seed']} | {machine} | {first:.3f} | {last:.3f} | **{change:+.3f}** | "
                         f"{'yes' if change >= NEED else 'no'} | {r['eval'][-1]:.3f} ({round(48 * r['eval'][-1])}/48) | "
                         f"{'' if ws is None else f'{ws:.1%}'} | "
                         f"{wall(r)} |")
        per_label[label] = {"seeds": [r["seed"] for r in rows], "changes": changes,
                            "min_change": min(changes), "mean_change": float(np.mean(changes)),
                            "all_at_least_0.15": all(c >= NEED for c in changes)}
    long = [r for r in records if len(r["eval"]) > min(HORIZONS)]
    if long:  # what a shorter demo would have shown: the same runs cut after h iterations
        lines += ["", "Change if the demo stopped after h iterations (the first h iterations of a longer run are "
                  "those of an h-iteration run; blank: the run is shorter):", "",
                  "| variant | seed | " + " | ".join(f"h = {h}" for h in HORIZONS) + " |",
                  "|---|---|" + "---|" * len(HORIZONS)]
        for r in sorted(long, key=lambda r: (r["label"], r["seed"])):
            lines.append(f"| {r['label']} | {r['seed']} | "
                         + " | ".join(f"{thirds(r['eval'], h)[2]:+.3f}" if len(r["eval"]) >= h else ""
                                      for h in HORIZONS) + " |")
    result = {"records": records, "per_variant": per_label}
    with open(os.path.join(out, "results.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(out, "table.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    plot(records, os.path.join(out, "success.png"))
    return result


def plot(records: list[dict], path: str) -> None:
    if not records:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = sorted({r["label"] for r in records})
    cols = min(4, len(labels))
    rows = -(-len(labels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.4 * rows), sharey=True, squeeze=False)
    for ax in axes.flat[len(labels):]:
        ax.axis("off")
    for ax, label in zip(axes.flat, labels):
        for r in sorted((r for r in records if r["label"] == label), key=lambda r: r["seed"]):
            ax.plot(np.arange(1, len(r["eval"]) + 1), r["eval"], label=f"seed {r['seed']}", lw=1.2)
        ax.set_title(label)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for row in axes:
        row[0].set_ylabel(f"held-out success ({SPLIT}, 48 tasks)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2, 3, 4])
    ap.add_argument("--label", default="demo")
    ap.add_argument("--sft", nargs="*", default=[], help="extra overrides for hgpo-jax sft toy_format")
    ap.add_argument("--rl", nargs="*", default=[], help="extra overrides for hgpo-jax train toy_hgpo")
    ap.add_argument("--xla-flags", default="", help="XLA_FLAGS for both commands")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--cores-per-job", type=int, default=0, help="pin each job to this many cores (0: no pin)")
    ap.add_argument("--first-core", type=int, default=0, help="the first core the jobs are pinned to")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--no-profile", dest="profile", action="store_false",
                    help="skip the warm start's profile (toy_strategy.py)")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "results", "make_run_seeds"))
    ap.add_argument("--runs", default=os.path.join(ROOT, "runs", "make_run_seeds"))
    ap.add_argument("--collect", action="store_true", help="only gather the finished runs")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if not args.collect and args.seeds:
        slots = queue.Queue()  # each job's cores; a seed takes a free slot and gives it back
        for j in range(args.jobs):
            first = args.first_core + j * args.cores_per_job
            slots.put(list(range(first, first + args.cores_per_job))
                      if args.cores_per_job else None)

        def pinned(seed: int) -> dict:
            cores = slots.get()
            try:
                return one_seed(args, seed, cores)
            finally:
                slots.put(cores)

        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            for fut in [pool.submit(pinned, seed) for seed in args.seeds]:
                try:
                    fut.result()
                except Exception as e:  # keep the other seeds going; the log names the failure
                    print(f"failed: {e}", flush=True)
    result = collect(args.out)
    for label, v in result["per_variant"].items():
        print(f"{label}: changes {', '.join(f'{c:+.3f}' for c in v['changes'])}; min {v['min_change']:+.3f}"
              f", every seed >= +0.15: {v['all_at_least_0.15']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
