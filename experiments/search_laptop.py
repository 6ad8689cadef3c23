"""Search QA at laptop scale: an agent that visibly learns to search, on a CPU (issue item 7).
The stage machinery is experiments/laptop.py's, as for experiments/webshop_laptop.py.

  python -m experiments.search_laptop                 # every stage not finished yet, in order
  python -m experiments.search_laptop --stage rl      # one stage (resumes where it stopped)
  python -m experiments.search_laptop --status        # what is done, with wall times

The task: the search env as verl-agent runs it (BM25 top 3 in <information>, the authors'
projection and EM reward, 4 turns), over the synthetic world `env.search.dataset=synthetic`
(hgpo_jax/envs/search/synthetic.py): made-up people, cities and countries; one-hop questions
(where born, profession) and two-hop ones (country of birth: the person's passage gives the
city, a second search the city's passage, which gives the country). Held-out questions are about
people and cities never trained on.

Stages (each resumable):
1. experts: the scripted policies' EM on every test and train question (the expert: 1.0; the
   random policy the warm start imitates: near chance), kept in OUT/experts.json.
2. sft: a small Qwen2 built here (`build:search-small`) warm-started by `hgpo-jax sft
   search_laptop_sft` on random episodes of 8 other generated worlds (400 steps), then a second
   round on fresh ones (`sft_more`, 500 steps: after the first round the model still miscopied
   most names out of <information>, sampled rollout EM 0.01), then a third (`sft_mix`, 300
   steps) on episodes of which a quarter are the expert's (other worlds too): after two rounds
   of random episodes alone, a rollout at T 1.0 never won a two-hop question (0 of 127), so RL
   never saw one succeed; exported (float32) to OUT/warm_start. The random policy knows the
   format and the mechanics (queries from the question's words, an entity of the top passage
   copied) but chooses at random: which words to search, which entity to answer, when to search
   again are left to RL; the expert's quarter shows them, in worlds whose names never recur.
3. eval_warm: the warm start on the first 96 test questions, once each, greedy; episodes kept.
4. rl: GiGPO (exact anchors), GiGPO with similarity groups (algo.similarity_thresh=0.9, the
   authors' search setting), HGPO (K=2) and GRPO from the warm start under equal compute
   (`hgpo-jax train search_laptop_rl`: held-out EM after every iteration), per seed; each run
   evaluated as in 3 after its training.
5. report: OUT/results.json (per arm: seeds, heldout_change = held-out EM of the last third of
   the iterations minus the first third, one value per seed; paired differences between arms by
   seed with 95% t intervals; the command), OUT/results.md, OUT/heldout_em.png (held-out EM per
   iteration, every run) and OUT/dynamics.png.
"""

from __future__ import annotations

import json
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from experiments import laptop

EXPERTS = "experts.json"
ARMS = ("gigpo", "gigpo_sim", "hgpo_k2", "grpo")
SEEDS = (0, 1, 2)
HELDOUT = "eval/test"  # the held-out series: EM on the test questions, after every iteration
PAIRS = (("gigpo_sim", "gigpo"), ("hgpo_k2", "gigpo"), ("gigpo", "grpo"), ("gigpo_sim", "grpo"),
         ("hgpo_k2", "grpo"))
_ARGV: list[str] = []  # this invocation's arguments (the command results.json records)


# ----------------------------------------------------------------------------------- experts
def policy_em(split: str, kind: str, seed: int = 0) -> dict:
    """A scripted policy's EM on every question of `split` of the synthetic world, overall and
    per data source."""
    from hgpo_jax.envs.search import SearchOptions, make_search_env, split_questions, synthetic

    options = SearchOptions(dataset="synthetic")
    env = make_search_env(options, max_turns=4)
    tasks = [f"{split}:{i}" for i in range(len(split_questions(options, split)))]
    episodes = synthetic.record(env, tasks, kind, seed=seed)
    out = {"all": sum(ep.won for ep in episodes) / len(episodes), "questions": len(episodes)}
    for source in sorted({env.questions[t].data_source for t in tasks}):
        won = [ep.won for ep, t in zip(episodes, tasks) if env.questions[t].data_source == source]
        out[source] = sum(won) / len(won)
    return out


def stage_experts(args, state: dict) -> dict:
    result = {kind: {split: policy_em(split, kind) for split in ("test", "train")}
              for kind in ("expert", "random")}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, EXPERTS), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    return result


# ----------------------------------------------------------------------------------- report
def last_eval(run_dir: str) -> dict[str, float]:
    """The last logged evaluation on the test questions: EM overall and per data source."""
    from hgpo_jax.metrics import read_metrics

    out = {}
    for record in read_metrics(run_dir):
        if f"{HELDOUT}/all" in record:
            out = {k[len(HELDOUT) + 1:]: float(v) for k, v in record.items()
                   if k.startswith(HELDOUT + "/") and k.count("/") == 2
                   and isinstance(v, (int, float)) and not k.endswith("/episodes")}
    return out


def heldout_series(run_dir: str) -> list[float]:
    """Held-out EM after each training iteration, in iteration order: the trainer's evaluations
    (the first record of each step; the kept log then holds the separate evaluation after
    training, whose record repeats the last step)."""
    from hgpo_jax.metrics import read_metrics

    by_step: dict[int, float] = {}
    for r in read_metrics(run_dir):
        if f"{HELDOUT}/all" in r and "step" in r:
            by_step.setdefault(int(r["step"]), float(r[f"{HELDOUT}/all"]))
    return [by_step[k] for k in sorted(by_step)]


def thirds(series: list[float]) -> tuple[float, float, float]:
    """(first third, last third, change) of a series (the demo's summary: its k = n // 3 first
    and last points, equal weights)."""
    k = len(series) // 3
    if k == 0:
        return math.nan, math.nan, math.nan
    first, last = sum(series[:k]) / k, sum(series[-k:]) / k
    return first, last, last - first


def mean_ci(values) -> tuple[float, float]:
    """(mean, half-width of the 95% Student t interval; NaN for fewer than 2 values)."""
    from experiments.study import mean_ci as ci

    return ci(values)


def arm_results(args) -> dict:
    """{arm: {seeds, heldout_change, heldout_first_third, heldout_last_third, heldout_em (per
    iteration, per seed), final (the evaluation after training, per seed)}} of the kept runs."""
    logs = laptop.kept_rl_logs(args)
    out = {}
    for arm in args.estimators:
        kept = [(seed, logs[f"{arm}_s{seed}"]) for seed in args.seeds if f"{arm}_s{seed}" in logs]
        series = [heldout_series(log) for _, log in kept]
        parts = [thirds(s) for s in series]
        out[arm] = {"seeds": [seed for seed, _ in kept],
                    "heldout_change": [c for _, _, c in parts],
                    "heldout_first_third": [f for f, _, _ in parts],
                    "heldout_last_third": [last for _, last, _ in parts],
                    "heldout_em": series, "final": [last_eval(log) for _, log in kept]}
    return out


def paired_arms(arms: dict) -> dict:
    """Per pair of arms (a, b): the per-seed differences a - b of heldout_change and of the last
    third's held-out EM on the seeds both ran (same seed: same warm start, same first batches of
    questions), their mean with its 95% t interval, and how many seeds a is ahead."""
    out = {}
    for a, b in PAIRS:
        if a not in arms or b not in arms:
            continue
        seeds = [s for s in arms[a]["seeds"] if s in arms[b]["seeds"]]
        if not seeds:
            continue
        entry = {"seeds": seeds}
        for key in ("heldout_change", "heldout_last_third"):
            va = dict(zip(arms[a]["seeds"], arms[a][key]))
            vb = dict(zip(arms[b]["seeds"], arms[b][key]))
            diff = [va[s] - vb[s] for s in seeds]
            mean, half = mean_ci(diff)
            entry[key] = {"per_seed": diff, "mean": mean, "ci95": [mean - half, mean + half],
                          "ahead": sum(d > 0 for d in diff)}
        out[f"{a} - {b}"] = entry
    return out


def table1_lines(rows: dict[str, list[dict]]) -> list[str]:
    """EM (%) on the test questions at the final evaluation: overall, one-hop, two-hop."""
    lines = ["| method | EM all | EM one-hop | EM two-hop |", "|---|---|---|---|"]
    for name, evals in rows.items():
        lines.append(f"| {name} | " + " | ".join(laptop.cell([e[k] for e in evals if k in e])
                                                 for k in ("all", "onehop", "twohop")) + " |")
    return lines


def f3(v: float) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:+.3f}"


def arms_md(arms: dict, paired: dict, command: str) -> str:
    lines = ["", f"Held-out EM per run (`{command}`): the trainer's evaluation of 96 test questions"
             " (people and cities never trained on) after every iteration, greedy; change = mean"
             " of the last third of the iterations - mean of the first third. Mean with its 95% t"
             " interval over seeds.", "",
             "| arm | seeds | first third | last third | **change** | change per seed | >= +0.15 |",
             "|---|---|---|---|---|---|---|"]
    for arm, r in arms.items():
        if not r["seeds"]:
            continue
        m, h = mean_ci(r["heldout_change"])
        first, last = mean_ci(r["heldout_first_third"])[0], mean_ci(r["heldout_last_third"])[0]
        lines.append(f"| {arm} | {r['seeds']} | {first:.3f} | {last:.3f} | **{f3(m)}** ± "
                     f"{'-' if not math.isfinite(h) else f'{h:.3f}'} | "
                     + ", ".join(f3(c) for c in r["heldout_change"])
                     + f" | {sum(c >= 0.15 for c in r['heldout_change'])}/{len(r['seeds'])} |")
    if paired:
        lines += ["", "Arms paired by seed (a - b; 95% t interval over the seeds both ran):", "",
                  "| a - b | seeds | change: mean [95%] | a ahead | last third: mean [95%] | a ahead |",
                  "|---|---|---|---|---|---|"]
        for pair, e in paired.items():
            c, t = e["heldout_change"], e["heldout_last_third"]
            lines.append(f"| {pair} | {len(e['seeds'])} | {f3(c['mean'])} [{f3(c['ci95'][0])}, "
                         f"{f3(c['ci95'][1])}] | {c['ahead']} | {f3(t['mean'])} [{f3(t['ci95'][0])}, "
                         f"{f3(t['ci95'][1])}] | {t['ahead']} |")
    return "\n".join(lines) + "\n"


def plot_heldout(arms: dict, path: str) -> None:
    """Held-out EM per iteration: every run thin, each arm's mean over seeds thick."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (arm, r) in enumerate(arms.items()):
        if not r["heldout_em"]:
            continue
        colour = f"C{i}"
        for s in r["heldout_em"]:
            ax.plot(range(1, len(s) + 1), s, color=colour, alpha=0.3, lw=0.8)
        n = min(len(s) for s in r["heldout_em"])
        mean = np.mean([s[:n] for s in r["heldout_em"]], axis=0)
        ax.plot(range(1, n + 1), mean, color=colour, lw=2, label=f"{arm} ({len(r['seeds'])} seeds)")
    ax.set_xlabel("iteration")
    ax.set_ylabel("held-out EM (test questions, greedy)")
    ax.set_ylim(0, 1)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def stage_report(args, state: dict) -> dict:
    """The tables and the plots, from what OUT keeps (no run folder needed)."""
    rows = {}
    experts = laptop.read_kept(args.out, EXPERTS)
    if experts is not None:
        rows["expert (scripted)"] = [experts["expert"]["test"]]
        rows["random policy (the warm start's data)"] = [experts["random"]["test"]]
    arms = arm_results(args)
    paired = paired_arms(arms)
    command = " ".join(["python -m experiments.search_laptop", *_ARGV])
    if any(r["seeds"] for r in arms.values()):
        plot_heldout(arms, os.path.join(args.out, "heldout_em.png"))
    from experiments.webshop_laptop import paired_section

    # EM is the episode's `won` (a search episode's score is 0); the evaluation is greedy
    goal_results, goal_md = paired_section(args.out, key="won", unit="question",
                                           caption="the same test questions, greedy; a question"
                                                   " scores its EM")
    return laptop.write_report(
        args, state, last_eval=last_eval, table1_lines=table1_lines, rows=rows,
        caption="EM (%) on the synthetic world's test questions (the first 96, each once) greedy"
                " after training; the scripted policies: all 450 test questions.",
        first_last_keys={"EM": "success/all", "invalid": "rollout/invalid_action_rate"},
        runs_caption="RL runs: rollout EM and invalid-action rate over the first and last 5"
                     " iterations", plot_metrics=("success/all",),
        extra_results={**arms, "paired_arms": paired, "command": command, **goal_results},
        extra_md=arms_md(arms, paired, command) + goal_md)


# ----------------------------------------------------------------------------------- the study
def add_arguments(parser) -> None:
    parser.set_defaults(seeds=list(SEEDS), estimators=list(ARMS))


STUDY = laptop.Study(
    name="search_laptop", sft_config="search_laptop_sft", rl_config="search_laptop_rl",
    experts=stage_experts, report=stage_report,
    experts_done=lambda args: os.path.isfile(os.path.join(args.out, EXPERTS)),
    more_sft=(("sft_more", ["sft.episodes=4000", "sft.steps=500", "optim.lr=2e-3",
                            "optim.warmup_steps=10", "train.seed=1"]),
              # a quarter of the episodes the expert's (other worlds): the random policy's
              # copies stayed garbled at T 1.0, and no two-hop question was ever won
              ("sft_mix", ["sft.data=random_other:3000+expert_other:1000", "sft.steps=300",
                           "optim.lr=1.5e-3", "optim.warmup_steps=10", "train.seed=3"])),
    keep_episodes=True, add_arguments=add_arguments)


def main(argv=None) -> int:
    _ARGV[:] = sys.argv[1:] if argv is None else list(argv)
    return laptop.main(STUDY, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
