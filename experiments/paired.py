"""Compare policies goal by goal from `hgpo-jax eval --episodes` files.

  python -m experiments.paired warm.jsonl hgpo_s0.jsonl hgpo_s1.jsonl [--json out.json]

The first file is the baseline. Each other file is matched to it by (split, task): only goals both
played count. Per split and file: the goals matched, both mean scores, the mean paired difference
(other - baseline) with its standard error (sample std of the differences / sqrt(n)) and a normal
95% interval, and how many goals scored higher, lower or the same. Two policies evaluated on the
same goals share each goal's difficulty, so the paired standard error is what says whether a
difference of a few hundredths is more than sampling: an unpaired comparison of two means carries
the spread between goals too.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np


def read_episodes(path: str, key: str = "score") -> dict[tuple[str, str], float]:
    """{(split, task as text): the episode's `key`} of one `--episodes` file: its `score` (WebShop's
    reward in [0, 1]) by default, or `won` (1.0 or 0.0; the search env's EM, whose score is 0)."""
    out = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                e = json.loads(line)
                out[(str(e["split"]), json.dumps(e["task"]))] = float(e[key])
            except (ValueError, KeyError, TypeError) as err:
                raise SystemExit(f"{path}:{n}: not an `hgpo-jax eval --episodes` line ({err})") from None
    return out


def paired(base: dict[tuple[str, str], float], other: dict[tuple[str, str], float]) -> dict[str, dict]:
    """Per split: the paired comparison of `other` against `base` on the goals both played."""
    out = {}
    for split in sorted({s for s, _ in base}):
        keys = sorted(k for k in base if k[0] == split and k in other)
        if not keys:
            continue
        a = np.array([base[k] for k in keys])
        b = np.array([other[k] for k in keys])
        d = b - a
        se = float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else 0.0
        out[split] = {"goals": len(keys), "base": float(a.mean()), "other": float(b.mean()),
                      "diff": float(d.mean()), "diff_se": se,
                      "ci95": [float(d.mean() - 1.96 * se), float(d.mean() + 1.96 * se)],
                      "higher": int((d > 0).sum()), "lower": int((d < 0).sum()),
                      "same": int((d == 0).sum())}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", help="the baseline's --episodes file, then the others'")
    parser.add_argument("--json", help="also write the comparisons to this file")
    parser.add_argument("--key", default="score", choices=("score", "won"),
                        help="what each episode scores: its score (default) or won (search: EM)")
    args = parser.parse_args(argv)
    if len(args.files) < 2:
        parser.error("give the baseline's --episodes file and at least one other")
    base = read_episodes(args.files[0], args.key)
    results = {}
    print(f"baseline {args.files[0]}")
    print("| file | split | goals | baseline | other | paired diff ± SE | 95% interval | higher / lower / same |")
    print("|---|---|---|---|---|---|---|---|")
    for path in args.files[1:]:
        results[path] = paired(base, read_episodes(path, args.key))
        if not results[path]:
            print(f"| {path} | - | 0 (no goal in common with the baseline) | | | | | |")
        for split, r in results[path].items():
            print(f"| {path} | {split} | {r['goals']} | {r['base']:.3f} | {r['other']:.3f} | "
                  f"{r['diff']:+.3f} ± {r['diff_se']:.3f} | [{r['ci95'][0]:+.3f}, {r['ci95'][1]:+.3f}] | "
                  f"{r['higher']} / {r['lower']} / {r['same']} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"baseline": args.files[0], "paired": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
