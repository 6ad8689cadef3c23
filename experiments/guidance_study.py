"""Expert-guided rollouts (Agent-G², docs/guidance.md) against the same estimator without them,
on the history-dependent toy task, several paired seeds: does guidance raise hint-free success?

  python -m experiments.guidance_study                          # 5 seeds x 6 arms
  taskset -c 0 python -m experiments.guidance_study --seeds 0 2 4 &   # one process per core,
  taskset -c 1 python -m experiments.guidance_study --seeds 1 3       # then collect (finished
  python -m experiments.guidance_study                                # runs are reused)
  python -m experiments.guidance_study --seeds 0 --iterations 2 --arms grpo grpo_g2  # a quick look

The task is "toy-history" (experiments/compare_estimators.py's setting: press a coloured button,
walk a corridor, open the door of the pressed colour; memory H = 4). Per seed one format-only
warm start (hgpo-jax sft on random episodes) is shared by the arms: GRPO and HGPO K=2, each
without and with guidance (`guidance.kind=g2`, the authors' scripts' schedule values:
dynamic_sigma, batch_acc_low = batch_acc_high = 0.5; 3 clusters of the experts' lengths, 3-5
steps; the experts are the env's optimal solutions), without and with the authors' prefix-SFT
term (`guidance.sft_coef=0.5`, their scripts' value). Everything else is equal: 16 tasks x 8
rollouts per iteration, the optimizer, the loss, the iterations. After every iteration, success
on 48 held-out tasks at temperature 0.4, played WITHOUT a prefix (hint-free), is logged.

Writes OUT/results.json (per arm: held-out success per iteration with 95% intervals over seeds,
the last third per seed and its interval; per run its training statistics; per estimator the
paired difference guided - unguided of the last third, per seed, with its 95% t interval; the
guidance metrics; with --actions what the final policies do; wall times; the command),
OUT/results.md (its tables) and OUT/success.png. Runs live in OUT/runs/ (resumable).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from experiments.study import (SPLIT, curves, mean_ci, plot_success, rl_config, run_rl,
                               run_seconds, run_sft, write_results)

from hgpo_jax.envs.toy import PALETTE
from hgpo_jax.metrics import read_metrics

GUIDED = ["guidance.kind=g2", "guidance.sigma_mode=dynamic_sigma",
          "guidance.batch_acc_low=0.5", "guidance.batch_acc_high=0.5",
          "guidance.num_difficulty_groups=3"]
ARMS = {  # name -> overrides
    "grpo": ["algo.estimator=grpo"],
    "grpo_g2": ["algo.estimator=grpo", *GUIDED],
    "hgpo_k2": ["algo.estimator=hgpo", "algo.K=2"],
    "hgpo_k2_g2": ["algo.estimator=hgpo", "algo.K=2", *GUIDED],
    # with the authors' prefix-SFT term (their scripts' coefficient): the replayed steps are
    # also trained on as supervised rows, so the steps the policy no longer plays are kept
    "grpo_g2_sft": ["algo.estimator=grpo", *GUIDED, "guidance.sft_coef=0.5"],
    "hgpo_k2_g2_sft": ["algo.estimator=hgpo", "algo.K=2", *GUIDED, "guidance.sft_coef=0.5"],
}
PAIRS = (("grpo_g2", "grpo"), ("hgpo_k2_g2", "hgpo_k2"), ("grpo_g2_sft", "grpo"),
         ("hgpo_k2_g2_sft", "hgpo_k2"))


def guidance_curves(records: list[dict]) -> dict[str, list]:
    """Per iteration: the schedule's global centre, the batch success it saw, the mean replayed
    steps."""
    keys = {"mu_global": "guidance/mu_global", "batch_success": "guidance/batch_success",
            "prefix_steps": "guidance/prefix_steps"}
    return {k: [r.get(m) for r in records] for k, m in keys.items()}


def run_stats(records: list[dict], third: int) -> dict[str, float]:
    """Over a run's last `third` iterations: training success (guided arms: with their
    prefixes), optimizer updates per iteration, KL to the reference, and with guidance the mean
    share of the expert's steps replayed and mu_global."""
    last = records[-third:]
    keys = {"train_success": "success/all", "updates": "train/updates", "kl": "train/kl_loss",
            "prefix_share": "guidance/prefix_share", "mu_global": "guidance/mu_global"}
    return {k: float(np.mean([r[m] for r in last if m in r])) if any(m in r for r in last)
            else None for k, m in keys.items()}


PLACES = {"button": "room", "corridor": "corridor", "junction": "junction"}  # anchor word -> place
RIGHT = {"room": "press", "corridor": "go", "junction": "open"}  # the verb each place needs


def held_out_actions(cfg, resume: bool, tasks: int = 16, temperature: float = 0.4) -> dict:
    """What a policy does on the held-out tasks, hint-free: the run's last checkpoint (resume)
    or its warm start plays the first `tasks` held-out tasks, 8 rollouts each, at `temperature`;
    per place of the toy world (room, corridor, junction) the count of each action verb and the
    share of the verb that place needs; the rollouts' success; the doors opened (each ends its
    episode) and the share of them that was the pressed colour (door_accuracy; chance: 1/3); the
    colour the first step presses most often when its button is there, and how often
    (habit_colour, habit_share): a policy that always presses one colour and opens that colour's
    door wins whenever the task has it, without reading its memory (buttons and doors share the
    task's colours)."""
    from hgpo_jax.rl.rollout import collect_rollouts
    from hgpo_jax.trainers.rl import Trainer

    with Trainer(cfg, resume=resume, progress=False, record=False) as tr:
        group = tr.cfg.rollout.num_groups * tr.cfg.rollout.group_size // tasks
        batch = collect_rollouts(tr.policy(temperature), tr.pool,
                                 tr.env_spec.list_tasks(cfg.env, SPLIT)[:tasks], group,
                                 cfg.env.max_steps, cfg.env.memory_len, rng=123,
                                 spec=tr.env_spec, agent=tr.agent)
        replies = [tr.tokenizer.decode(r) for r in batch.response_ids]
    verbs: dict[str, dict[str, int]] = {p: {} for p in RIGHT}
    doors = 0  # a door of the junction opened: it ends the episode, won or lost
    present: dict[str, int] = {}  # first step: colour -> rooms showing its button
    pressed: dict[str, int] = {}  # colour -> first steps that pressed it
    for step, anchor, reply in zip(batch.step_id, batch.anchor, replies):
        place = next((p for word, p in PLACES.items() if word in anchor), None)
        if place is None:
            continue
        action = reply.split("<action>")[-1].split("</action>")[0].strip()
        verb = action.split(" ")[0] if action else "(none)"
        verbs[place][verb] = verbs[place].get(verb, 0) + 1
        doors += place == "junction" and verb == "open" and action[len("open "):] in anchor
        if step == 0:
            for colour in (c for c in PALETTE if f"{c} button" in anchor):
                present[colour] = present.get(colour, 0) + 1
                pressed[colour] = pressed.get(colour, 0) + (action == f"press {colour} button")
    right = {p: verbs[p].get(RIGHT[p], 0) / max(1, sum(verbs[p].values())) for p in RIGHT}
    wins = int(np.sum(batch.episode_won))
    habit = max(present, key=lambda c: pressed[c] / present[c])
    return {"success": float(np.mean(batch.episode_won)), "verbs": verbs, "right_verb": right,
            "doors_opened": int(doors), "door_accuracy": wins / max(1, int(doors)),
            "habit_colour": habit, "habit_share": pressed[habit] / present[habit]}


def summarize(runs: dict[str, dict[int, dict]], iterations: int) -> dict:
    third = max(1, iterations // 3)
    out = {"arms": {}, "paired": {}}
    for name, by_seed in runs.items():
        per_iter = [mean_ci([c["eval"][i] for c in by_seed.values() if i < len(c["eval"])])
                    for i in range(iterations)]
        last = {s: float(np.mean(c["eval"][-third:])) for s, c in by_seed.items()}
        out["arms"][name] = {"eval_mean": [m for m, _ in per_iter],
                             "eval_ci95": [h for _, h in per_iter],
                             "first_iteration": mean_ci([c["eval"][0] for c in by_seed.values()]),
                             "last_third": mean_ci(last.values()),
                             "last_third_per_seed": {str(s): v for s, v in last.items()}}
    for guided, plain in PAIRS:
        if guided in runs and plain in runs:
            seeds = sorted(set(runs[guided]) & set(runs[plain]))
            diff = {s: out["arms"][guided]["last_third_per_seed"][str(s)]
                    - out["arms"][plain]["last_third_per_seed"][str(s)] for s in seeds}
            out["paired"][f"{guided} - {plain}"] = {
                "per_seed": {str(s): d for s, d in diff.items()},
                "mean_ci95": mean_ci(diff.values()),
                "guided_better": sum(d > 0 for d in diff.values()), "seeds": len(diff)}
    return out


def report(result: dict) -> str:
    """results.md: the command, per arm the last third's hint-free held-out success (mean, 95%
    interval, per seed) and training statistics, the paired differences, and with --actions what
    the final policies do on held-out tasks."""
    f2 = "{:.3f}".format
    s, lines = result["summary"], [f"`{result['command']}`", "",
                                   f"Wall time {result['wall_seconds']:.0f} s in this invocation; "
                                   f"the runs' own time {result['run_seconds_total']:.0f} s.", ""]
    lines += ["| arm | held-out success, last third | per seed | training success | updates "
              "per iteration | KL | prefix share | mu_global |", "|---|---|---|---|---|---|---|---|"]
    for name, a in s["arms"].items():
        m, h = a["last_third"]
        per_seed = ", ".join(f2(v) for _, v in sorted(a["last_third_per_seed"].items()))
        st = list(result["stats"].get(name, {}).values())

        def mean(key):
            v = [x[key] for x in st if x.get(key) is not None]
            return f2(float(np.mean(v))) if v else "-"
        lines.append(f"| {name} | **{f2(m)}** +/- {f2(h)} | {per_seed} | {mean('train_success')} "
                     f"| {mean('updates')} | {mean('kl')} | {mean('prefix_share')} "
                     f"| {mean('mu_global')} |")
    lines += ["", "| guided - unguided | mean +/- 95% | per seed | guided better |", "|---|---|---|---|"]
    for pair, p in s["paired"].items():
        m, h = p["mean_ci95"]
        per_seed = ", ".join(f"{v:+.3f}" for _, v in sorted(p["per_seed"].items()))
        lines.append(f"| {pair} | **{m:+.3f}** +/- {f2(h)} | {per_seed} | "
                     f"{p['guided_better']} of {p['seeds']} |")
    if result.get("actions"):
        lines += ["", "| seed | policy | success | door accuracy (doors) | colour pressed most, "
                  "share | right verb: room / corridor / junction |", "|---|---|---|---|---|---|"]
        for name, by_seed in result["actions"].items():
            for seed, a in sorted(by_seed.items()):
                rv = a["right_verb"]
                lines.append(f"| {seed} | {name} | {f2(a['success'])} | {a['door_accuracy']:.2f} "
                             f"({a['doors_opened']}) | {a['habit_colour']} {a['habit_share']:.2f} "
                             f"| {rv['room']:.2f} / {rv['corridor']:.2f} / {rv['junction']:.2f} |")
    return "\n".join(lines) + "\n"


def parser(doc: str, env: str, out: str, memory_len: int = 4, split: str = SPLIT,
           sft_extra: tuple = ()) -> argparse.ArgumentParser:
    """The arguments of a guidance study (this one's, experiments/guidance_sparse.py's): its env,
    output folder, memory, held-out split and the warm start's extra overrides (`sft_extra`,
    e.g. the env's built model) as defaults."""
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--iterations", type=int, default=15)
    ap.add_argument("--sft-steps", type=int, default=100)
    ap.add_argument("--env", default=env)
    ap.add_argument("--memory-len", type=int, default=memory_len)
    ap.add_argument("--split", default=split, help="the held-out split evaluated every iteration")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "results", out))
    ap.add_argument("overrides", nargs="*", help="extra key=value overrides for every RL run")
    ap.set_defaults(sft_extra=list(sft_extra))
    return ap


def run_arms(args) -> tuple[dict, dict, dict, dict]:
    """Every seed's warm start, then each arm's RL run from it (`study.run_sft`, `run_rl`:
    finished runs reused, cut ones resumed) -> (runs: {arm: {seed: curves}}, stats: {arm:
    {seed: run_stats}}, guidance: {guided arm: {seed: guidance_curves}}, timing: {run: s})."""
    runs: dict[str, dict[int, dict]] = {name: {} for name in args.arms}
    stats: dict[str, dict[int, dict]] = {name: {} for name in args.arms}
    guidance: dict[str, dict[int, dict]] = {name: {} for name in args.arms if "g2" in name}
    timing = {}
    held_out = [] if args.split == SPLIT else [f"eval.splits=[{args.split}]"]
    for seed in args.seeds:
        sft_dir = run_sft(args.out, seed, args.env, args.memory_len, args.sft_steps,
                          extra=args.sft_extra)
        timing[f"sft-s{seed}"] = run_seconds(read_metrics(sft_dir))
        for name in args.arms:
            records = run_rl(args.out, name, seed, sft_dir, args.env, args.memory_len,
                             args.iterations, ["train.save_every=1", *held_out, *args.overrides],
                             ARMS)
            timing[f"{name}-s{seed}"] = run_seconds(records)
            runs[name][seed] = curves(records, args.split)
            stats[name][seed] = run_stats(records, max(1, args.iterations // 3))
            if name in guidance:
                guidance[name][seed] = guidance_curves(records)
            c = runs[name][seed]["eval"]
            print(f"seed {seed} {name:<11} held-out success first {c[0]:.3f} last {c[-1]:.3f} "
                  f"({timing[f'{name}-s{seed}']:.0f} s)", flush=True)
    return runs, stats, guidance, timing


def finish(args, runs: dict, summary: dict, result: dict) -> str:
    """OUT/success.png (hint-free held-out success per iteration, each arm's mean and 95% band)
    and the summary printed: each arm's last third, the paired differences -> the plot's path."""
    png = plot_success({n: (s["eval_mean"], s["eval_ci95"], len(runs[n]))
                        for n, s in summary["arms"].items()}, os.path.join(args.out, "success.png"),
                       f"{args.env}, hint-free held-out success: mean and 95% interval",
                       args.split)
    for name, s in summary["arms"].items():
        m, h = s["last_third"]
        print(f"{name:<14} held-out success, last third {m:.3f} +/- {h:.3f}")
    for pair, p in summary["paired"].items():
        m, h = p["mean_ci95"]
        print(f"{pair}: {m:+.3f} +/- {h:.3f} (guided better on {p['guided_better']} of "
              f"{p['seeds']} seeds)")
    print(f"wrote {os.path.join(args.out, 'results.json')} and {png} "
          f"({result['wall_seconds']:.0f} s)")
    return png


def main(argv=None) -> dict:
    ap = parser(__doc__, "toy-history", "guidance_study")
    ap.add_argument("--actions", type=int, nargs="*", default=[], metavar="SEED",
                    help="for these seeds, tabulate what each arm's final policy and the warm "
                         "start do on held-out tasks, place by place (held_out_actions)")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    runs, stats, guidance, timing = run_arms(args)
    summary = summarize(runs, args.iterations)
    actions: dict[str, dict[int, dict]] = {}  # name -> seed -> held_out_actions
    for seed in args.actions:
        sft_dir = run_sft(args.out, seed, args.env, args.memory_len, args.sft_steps)
        extra = ["train.save_every=1", *args.overrides]
        folders = {"warm start": ("grpo", os.path.join(args.out, "runs", f"warm-s{seed}"), False),
                   **{n: (n, os.path.join(args.out, "runs", f"{n}-s{seed}"), True)
                      for n in args.arms}}
        for name, (arm, folder, resume) in folders.items():
            kept = os.path.join(args.out, "runs", f"actions-{name.replace(' ', '_')}-s{seed}.json")
            if os.path.isfile(kept):  # tabulated by an earlier invocation
                with open(kept) as f:
                    a = json.load(f)
            else:
                a = held_out_actions(rl_config(folder, arm, seed, sft_dir, args.env,
                                               args.memory_len, args.iterations, extra, ARMS),
                                     resume=resume)
                with open(kept, "w") as f:
                    json.dump(a, f)
            actions.setdefault(name, {})[seed] = a
            print(f"seed {seed} {name:<15} success {a['success']:.3f}  door accuracy "
                  f"{a['door_accuracy']:.2f} ({a['doors_opened']} doors)  presses {a['habit_colour']} "
                  f"{a['habit_share']:.2f} of the time  right verb: "
                  + "  ".join(f"{p} {v:.2f}" for p, v in a["right_verb"].items()), flush=True)
    result = write_results("guidance_study.py", argv, args, t0, timing, summary, runs=runs,
                           stats=stats, guidance=guidance, actions=actions)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(report(result))
    finish(args, runs, summary, result)
    return result


if __name__ == "__main__":
    main()
