"""What a toy-env policy actually does, task by task: which button it presses and which door it
opens, read against what each held-out task allows (issue 46's diagnosis of `make run`).

    python -m experiments.toy_strategy RUN_DIR [RUN_DIR ...] [--split valid_seen] [--games 48]
        [--temperature 0.4] [--samples 4] [--json PATH]

For every run folder (its latest checkpoint) it plays each of the first `--games` tasks of the
split `--samples` times (seeds 0..samples-1, the run's memory window and step limit) and
classifies each episode:

- the button: its position in the room's list (0, 1, 2), or "none" when no press happened;
- the door: its position in the junction's list, or "none" (no door opened);
- whether the press was still inside the memory window when the door was chosen;
- the colour pressed, to see a fixed-colour habit (a policy that always presses and opens
  "red" wins exactly the tasks whose three colours include red: half of them).

It prints, per run, success overall, by corridor length and by whether a fixed colour is among
the task's colours, and the most frequent (button colour, door colour) habits.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys


def inadmissible(env, task, actions) -> int:
    """How many of an episode's actions were not admissible where they were taken (replayed on
    `env` from `reset(task)`): the env answers those "Nothing happens." and no penalty applies,
    since verl-agent's projection checks the reply's format, not the action."""
    _, info = env.reset(task)
    count = 0
    for action in actions:
        count += " ".join(action.lower().split()) not in info["admissible_actions"]
        _, _, done, info = env.step(action)
        if done:
            break
    return count


def classify(turns, env) -> dict:
    """One watched episode's press, door and win, read from its turns' actions and the env."""
    pressed = door = None
    press_step = door_step = None
    for t, turn in enumerate(turns):
        action = turn.parsed.action or ""
        words = action.split()
        if pressed is None and len(words) == 3 and words[0] == "press" and words[2] == "button" \
                and words[1] in env.colors:
            pressed, press_step = words[1], t
        elif pressed is not None and len(words) == 3 and words[0] == "open" and words[2] == "door" \
                and words[1] in env.doors:
            door, door_step = words[1], t
            break
    return {
        "button_pos": env.colors.index(pressed) if pressed else None,
        "button": pressed,
        "door_pos": env.doors.index(door) if door else None,
        "door": door,
        "press_in_memory": None if door_step is None else door_step - press_step,
        "won": bool(env.won),
        "length": len(turns),
        "invalid": sum(not turn.parsed.valid for turn in turns),
    }


def play(run_dir: str, split: str, games: int, temperature: float, samples: int) -> list[dict]:
    from hgpo_jax.agents import get_agent
    from hgpo_jax.config import load_config
    from hgpo_jax.envs.registry import get_env, with_reward
    from hgpo_jax.rl.episodes import watch_episode
    from hgpo_jax.rl.policy import Policy
    from hgpo_jax.runs import load_model

    cfg = load_config(run_dir)
    spec = with_reward(get_env(cfg.env.name), cfg.env.reward)
    agent = get_agent(cfg.agent.name, cfg.env.name, projection=cfg.env.projection)
    model, tokenizer, _ = load_model(run_dir)
    policy = Policy.of_rollout(model, tokenizer, cfg.rollout, temperature)
    env = spec.make_env(cfg.env)()
    rows = []
    for index, task in enumerate(spec.list_tasks(cfg.env, split)[:games]):
        for seed in range(samples):
            episode = watch_episode(policy, env, task, cfg.env.max_steps, cfg.env.memory_len,
                                    rng=seed, spec=spec, agent=agent)
            row = classify(episode.turns, env)
            row["inadmissible"] = inadmissible(env, task, [t.parsed.action or "" for t in episode.turns])
            row.update(task=int(task), seed=seed, corridor=env.corridor, colors=list(env.colors),
                       memory_len=cfg.env.memory_len)
            rows.append(row)
    return rows


def summarize(rows: list[dict]) -> dict:
    """Success overall and by group, and the most common habits."""
    def rate(sel):
        sel = list(sel)
        return (sum(r["won"] for r in sel) / len(sel), len(sel)) if sel else (float("nan"), 0)

    out = {"success": rate(rows)}
    for L in sorted({r["corridor"] for r in rows}):
        out[f"corridor={L}"] = rate(r for r in rows if r["corridor"] == L)
    pos = collections.Counter((r["button_pos"], r["door_pos"]) for r in rows)
    out["positions (button, door)"] = pos.most_common(6)
    col = collections.Counter(r["button"] for r in rows)
    out["buttons pressed"] = col.most_common(6)
    top = col.most_common(1)[0][0] if col else None
    if top:
        out[f"tasks with {top}"] = rate(r for r in rows if top in r["colors"])
        out[f"tasks without {top}"] = rate(r for r in rows if top not in r["colors"])
    out["invalid per episode"] = sum(r["invalid"] for r in rows) / max(len(rows), 1)
    out["inadmissible actions per turn"] = (sum(r["inadmissible"] for r in rows)
                                            / max(sum(r["length"] for r in rows), 1))
    out["press visible at the door"] = rate(
        r for r in rows if r["press_in_memory"] is not None and r["press_in_memory"] <= r["memory_len"])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--split", default="valid_seen")
    p.add_argument("--games", type=int, default=48)
    p.add_argument("--temperature", type=float, default=0.4)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    results = {}
    for run in args.runs:
        rows = play(run, args.split, args.games, args.temperature, args.samples)
        results[run] = {"summary": summarize(rows), "episodes": rows}
        print(f"== {run}")
        for k, v in results[run]["summary"].items():
            print(f"  {k}: {v}")
        sys.stdout.flush()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
