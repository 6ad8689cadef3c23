"""The search env's own options, `env.search.*` in a config (declared here, nested by the config
under the env's name: `EnvSpec.options`).

    env:
      name: search
      max_steps: 4                # turns per episode (verl-agent's env.max_steps)
      search:
        url: http://127.0.0.1:8000/retrieve   # a user's e5/wiki-18 server; "" = the embedded BM25
        topk: 3

Defaults are verl-agent's (`env.search` in its ppo_trainer.yaml and run_search.sh) where it has
one; the files default to the project's small set (hgpo_jax.envs.search.data). Field metadata
marks the paths a run records as absolute ("path") and the settings a resume may change
("run_setting"; hgpo_jax.runs).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hgpo_jax.problems import Problems, is_int, is_number

DATASETS = ("searchqa-small", "synthetic")  # env.search.dataset: the files of an unset corpus/train/test


@dataclass
class SearchOptions:
    """Where passages and questions come from (docs/envs.md, "Search-augmented QA")."""

    url: str = ""  # retrieval server (POST, verl-agent's protocol); "" = the embedded BM25 index over `corpus`
    topk: int = 3  # passages per search
    timeout: float = field(default=60.0, metadata={"run_setting": True})  # seconds per HTTP request (url only)
    retries: int = field(default=10, metadata={"run_setting": True})  # HTTP attempts before a search fails (url only; linear back-off, as verl-agent's client)
    corpus: str | None = field(default=None, metadata={"path": True})  # JSONL {id, title, text} or wiki-18's {id, contents}; None = the project's small set
    train: str | None = field(default=None, metadata={"path": True})  # questions of split "train": JSONL or verl-agent's parquet; None = the small set's
    test: str | None = field(default=None, metadata={"path": True})  # questions of split "test"; None = the small set's
    data_sources: list[str] = field(default_factory=list)  # keep only these data sources (empty: all)
    dataset: str = "searchqa-small"  # the files when corpus/train/test are unset: "searchqa-small" (the project's small set) or "synthetic" (a generated world, hgpo_jax.envs.search.synthetic)

    def problems(self, prefix: str = "env.search.") -> list[str]:
        """Every problem of these options, as config messages under `prefix`."""
        p = Problems(prefix)
        p.check(isinstance(self.url, str) and (not self.url or self.url.startswith(
            ("http://", "https://"))), "url", self.url, "'' (the embedded index) or an http(s):// URL")
        p.check(is_int(self.topk) and self.topk >= 1, "topk", self.topk, ">= 1 (an int)")
        p.check(is_number(self.timeout) and self.timeout > 0, "timeout", self.timeout, "> 0 seconds")
        p.check(is_int(self.retries) and self.retries >= 1, "retries", self.retries,
                ">= 1 (an int)")
        for key in ("corpus", "train", "test"):
            value = getattr(self, key)
            p.check(value is None or isinstance(value, str) and bool(value.strip()), key, value,
                    "a file path or null (the project's small set)")
        p.check(self.dataset in DATASETS, "dataset", self.dataset,
                f"one of {', '.join(DATASETS)}")
        p.check(isinstance(self.data_sources, (list, tuple)) and all(
            isinstance(s, str) and s for s in self.data_sources), "data_sources",
            self.data_sources, "a list of data source names (e.g. [hotpotqa, nq]) or []")
        return p.items
