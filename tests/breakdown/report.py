"""Tables of where the suite's time goes, from a file recorded with HGPO_JAX_TEST_BREAKDOWN
(tests/breakdown/plugin.py):

    python tests/breakdown/report.py /tmp/breakdown.jsonl [--top 25]

Columns (seconds): wall = the test's setup + call + teardown; jit = JAX tracing and lowering to
StableHLO in the test's own process; compile = XLA compiling there (persistent-cache reads
included; hits / misses counted); env = env engines and the worker pool (in this process:
resets, steps, pool start); children = the wall time of the Python processes the test started
(summed: two at once count twice), with their own JAX time (jit + compile) after the slash;
rest = wall - jit - compile - env, the test's own Python, NumPy and the waits on its children.
"""

from __future__ import annotations

import argparse
import collections
import json


def load(path: str):
    tests: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    fixtures: dict[tuple, float] = collections.Counter()
    spans: dict[str, list] = collections.defaultdict(list)  # worker -> [(start, end, test)]
    for line in open(path, encoding="utf-8"):
        r = json.loads(line)
        if r["kind"] == "test":
            t = tests[r["test"]]
            t["wall"] += r["wall_s"]
            t["jit"] += r.get("trace_s", 0) + r.get("lower_s", 0)
            t["compile"] += r.get("compile_s", 0)
            t["hits"] += r.get("cache_hits", 0)
            t["misses"] += r.get("cache_misses", 0)
            t["env"] += r.get("env_s", 0)
            spans[r["worker"]].append((r["start"], r["start"] + r["wall_s"], r["test"]))
        elif r["kind"] == "fixture":
            fixtures[(r["fixture"], r["scope"])] += r["wall_s"]
        elif r["kind"] == "child":
            t = tests[r["test"]]
            t["children"] += r["wall_s"]
            t["child_jax"] += r.get("trace_s", 0) + r.get("lower_s", 0) + r.get("compile_s", 0)
            t["child_count"] += 1
    for t in tests.values():
        t["rest"] = t["wall"] - t["jit"] - t["compile"] - t["env"]
    return tests, fixtures, spans


def row(name, t):
    kids = f"{t['children']:.0f} / {t['child_jax']:.0f} ({t['child_count']:.0f})" if t["child_count"] else "-"
    return (f"| {name} | {t['wall']:.1f} | {t['jit']:.1f} | {t['compile']:.1f} | "
            f"{t['hits']:.0f} / {t['misses']:.0f} | {t['env']:.1f} | {kids} | {t['rest']:.1f} |")


HEAD = ("| {} | wall | jit | compile | hits / misses | env | children (JAX) | rest |\n"
        "|---|---|---|---|---|---|---|---|")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("path")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    tests, fixtures, spans = load(args.path)

    total = collections.Counter()
    for t in tests.values():
        total.update(t)
    end = max(e for s in spans.values() for _, e, _ in s)
    start = min(s for v in spans.values() for s, _, _ in v)
    print(f"{len(tests)} tests; session {end - start:.0f} s from the first test's start to the "
          f"last one's end\n")
    print(HEAD.format("all tests"))
    print(row("sum", total))

    files: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for name, t in tests.items():
        files[name.split("::")[0]].update(t)
    for f in files.values():
        f["rest"] = f["wall"] - f["jit"] - f["compile"] - f["env"]
    print("\n" + HEAD.format("file"))
    for name, t in sorted(files.items(), key=lambda kv: -kv[1]["wall"])[:args.top]:
        print(row(name.replace("tests/", ""), t))

    print("\n" + HEAD.format("test"))
    for name, t in sorted(tests.items(), key=lambda kv: -kv[1]["wall"])[:args.top]:
        print(row(name.replace("tests/", ""), t))

    print("\n| fixture (scope) | set-up s, summed |\n|---|---|")
    for (name, scope), s in sorted(fixtures.items(), key=lambda kv: -kv[1])[:15]:
        print(f"| {name} ({scope}) | {s:.1f} |")

    print("\n| worker | tests | busy s | idle at the end s |\n|---|---|---|---|")
    for worker, s in sorted(spans.items()):
        busy = sum(e - b for b, e, _ in s)
        names = {n for _, _, n in s}
        print(f"| {worker} | {len(names)} | {busy:.0f} | {end - max(e for _, e, _ in s):.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
