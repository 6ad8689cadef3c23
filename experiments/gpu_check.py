"""The one-command device check: what to run first when a GPU is lent (minutes, one command).

    python experiments/gpu_check.py                        # one GPU: about 9 minutes on an H100
    python experiments/gpu_check.py --smoke --out /tmp/gpu_check.json   # CPU: tiny shapes, ~2-3 min
    python experiments/gpu_check.py --parts parity,decode --budget-s 200

Parts, in this order (`--parts` picks and orders them):
- parity: numerics on the device. A random Qwen2 of bench_common's shape (4 layers, hidden 256,
  head_dim 64, vocab 4,096; transformers' random init), built here under a temp folder: token
  log-probs of right-padded rows from our einsum and fused attention paths (fused: 'xla' in fp32;
  cuDNN in bf16 on a GPU, where cuDNN needs 16-bit activations; 'xla' stands in for it on a CPU)
  against each other and against transformers in fp32 on the same device (max / mean absolute
  difference over the real tokens), and greedy decoding of a few prompts by our sampler against
  transformers' greedy `generate` (fp32), and fused against einsum prefill (bf16).
- plan: `hgpo_jax.trainers.plan.plan` of the 1.5B paper configs of the three algorithm families
  (hgpo_k2, ppo, hiper on ALFWorld) on one device (mesh.fsdp=1), compiled here: the planned peak,
  set against the device's measured peak of that family's iteration below (when it ran).
- model: the random-weight model folder of `bench_iteration.py` (built once, reused).
- iteration:hgpo_k2, iteration:ppo, iteration:hiper: one `bench_iteration.py` iteration per
  family (group, critic, hierarchical) with `--steps` env steps, each with bench_iteration's
  phases, bounds and MFU, and the device's peak bytes (`memory_stats()["peak_bytes_in_use"]`;
  null where the backend has none, as on a CPU).
- decode: `probe_decode.py` at the paper's rollout shape (128 x 2048 + 512, fp32 master weights),
  the einsum decode (every cache slot) against the ragged one (each row's tokens,
  `hgpo_jax.models.gpu_attention`), each against its bounds at the device's memory bandwidth:
  every slot, and the real tokens (the issue-49 aim: >= 60% of the real-token bound).

Each part runs in a child process of its own session (its own device peak; a crash or hang
loses only that part) with a timeout; a part whose turn comes with less of `--budget-s` left
than it needs is skipped and recorded so; a running part may use `--grace-s` past the budget
before it is killed. The child's process group (its env workers included) is killed when it
ends, times out or the check is interrupted (Ctrl-C, SIGTERM). The JSON (`--out`, default
docs/results/gpu/gpu_check_<UTC time>.json) and a markdown table beside it (`.md`) are written
after every part. `--smoke`: every part with tiny shapes on the toy env (a CPU check of the
script itself). The parent never starts a JAX backend (it would take the GPU's memory).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import importlib.metadata
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# run by path on a lent GPU (`python experiments/gpu_check.py`, where the package may not be
# installed): the repository root makes hgpo_jax and experiments.benchmarks importable
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

GIB = 2**30
# (family, algorithm, paper config): one iteration and one plan each
FAMILIES = (("group", "hgpo_k2", "hgpo_k2_alfworld_qwen2.5_1.5b"),
            ("critic", "ppo", "ppo_alfworld_qwen2.5_1.5b"),
            ("hierarchical", "hiper", "hiper_alfworld_qwen2.5_1.5b"))
ITERATIONS = tuple(f"iteration:{algo}" for _, algo, _ in FAMILIES)
PART_ORDER = ("parity", "plan", "model", *ITERATIONS, "decode")
# seconds a part needs to be worth starting (near what it takes on an H100: a part started
# with less left would be killed at the budget, and the time lost to the parts after it), and
# the most it may run (a hang's cap); (full, smoke)
PART_SECONDS = {"parity": ((30, 180), (5, 240)), "plan": ((40, 200), (5, 200)),
                "model": ((20, 180), (2, 120)), "iteration": ((100, 330), (5, 240)),
                "decode": ((60, 240), (5, 120))}
SMOKE_ROLLOUT = ["rollout.num_groups=2", "rollout.group_size=2", "rollout.max_new_tokens=8",
                 "rollout.max_prompt_tokens=512", "train.mini_batch_size=4",
                 "train.micro_batch_size=2"]
VERSIONED = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "transformers", "tokenizers",
             "torch", "numpy", "textworld", "alfworld")


# =========================================================================== the settings
def settings(args) -> dict:
    """What every part's child needs: the command line's choices resolved for --smoke."""
    smoke = args.smoke
    steps = args.steps
    env = args.env or ("toy" if smoke else "alfworld")
    workers = 1 if smoke else max(1, min(14, (os.cpu_count() or 4) - 2))
    shapes = SMOKE_ROLLOUT if smoke else []
    return {
        "smoke": smoke, "shape": args.shape or ("tiny" if smoke else "1.5b"),
        "model_dir": args.model_dir, "env": env, "steps": steps,
        "min_prompt_tokens": (0 if smoke else 1536) if args.min_prompt_tokens is None
        else args.min_prompt_tokens,
        "iteration_overrides": [f"env.name={env}", f"env.max_steps={steps}",
                                f"env.num_workers={workers}", *shapes, *args.overrides],
        "plan_overrides": [*shapes, *args.overrides],  # after the shape's (part_plan)
        "plan_sampler": args.plan_sampler,
        "decode_shape": "local-tiny" if smoke else "1.5b",
        "decode_grid": args.decode_grid or ("2x9-32" if smoke else "128x2048"),
        "decode_new": args.decode_new or (8 if smoke else 512),
        "parity_lengths": [64, 40, 9, 1] if smoke else [1024, 700, 333, 64, 1],
        "greedy_lengths": [20, 7, 3] if smoke else [300, 120, 37, 5],
        "greedy_new": 6 if smoke else 32,
    }


def part_env(name: str, smoke: bool) -> dict:
    """The child's environment: unbuffered output; parity shares the GPU with torch (no
    preallocation); the iterations get 95% of the GPU's memory (HiPER at 1.5B needs ~67 GiB of an
    H100's 79) unless the caller set a fraction. --smoke compiles with XLA's backend
    optimizations off (as the tests do: the same numbers, about half the compile time)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    flags = env.get("XLA_FLAGS", "")
    if smoke and "xla_backend_optimization_level" not in flags:
        env["XLA_FLAGS"] = (flags + " --xla_backend_optimization_level=0"
                            " --xla_llvm_disable_expensive_passes=true").strip()
    if name == "parity":
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    elif name in ITERATIONS or name in ("model", "decode"):
        env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
    return env


# =========================================================================== the children
class ChildOutput:
    """The child's result file, rewritten whole (atomically) at every update, so that a part
    killed half way still hands back what it finished."""

    def __init__(self, path: str):
        self.path, self.data = path, {"status": "running"}

    def update(self, **fields) -> None:
        self.data.update(fields)
        write_json(self.path, self.data)


def device_info() -> dict:
    import jax

    devices = jax.devices()
    stats = devices[0].memory_stats() or {}
    return {"backend": jax.default_backend(), "device_kind": devices[0].device_kind,
            "device_count": len(devices), "memory_bytes_limit": stats.get("bytes_limit")}


def device_peak_bytes() -> int | None:
    """The default device's peak bytes in use in this process; None where the backend keeps no
    memory statistics (CPU)."""
    import jax

    stats = jax.devices()[0].memory_stats()
    return None if not stats else stats.get("peak_bytes_in_use")


def _diff(a, b, mask) -> dict:
    import numpy as np

    d = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))[mask]
    return {"max_abs": float(d.max()), "mean_abs": float(d.mean()), "positions": int(mask.sum())}


def part_parity(s: dict, out: ChildOutput) -> dict:
    """Log-probs of right-padded rows and greedy tokens: our attention paths against each other
    and against transformers (fp32, on this device)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.devices()  # JAX's backend (and its CUDA libraries) first, then torch's
    import torch
    from flax import nnx

    from experiments.benchmarks.bench_common import BENCH_SHAPE, bench_hf_model
    from hgpo_jax.models import load_pretrained
    from hgpo_jax.models.attention import resolve_attention
    from hgpo_jax.rl.sampling import Sampler, prefill_path
    from hgpo_jax.rl.update import token_logprobs

    gpu = jax.default_backend() == "gpu"
    fused16 = "cudnn" if gpu else "xla"
    hf_device = "cuda" if gpu and torch.cuda.is_available() else "cpu"
    head = BENCH_SHAPE["hidden_size"] // BENCH_SHAPE["num_attention_heads"]
    result = {
        "model": dict(BENCH_SHAPE, init="transformers' random init, seed 0"),
        "transformers_device": hf_device,
        "torch_tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "jax_default_matmul_precision": str(jax.config.jax_default_matmul_precision),
        "auto_attention": {dt: resolve_attention("auto", dt, head)
                           for dt in ("float32", "bfloat16")},
        "fused_16bit": fused16,
        "note": ("cuDNN flash attention needs 16-bit activations: it is compared in bf16; the "
                 "fp32 fused path is XLA's dot_product_attention" if gpu else
                 "no cuDNN on this backend: XLA's dot_product_attention stands in for the fused "
                 "path in fp32 and bf16"),
        "logprobs": [], "greedy": []}
    with tempfile.TemporaryDirectory(prefix="gpu_check-parity-") as folder:
        hf = bench_hf_model(0, folder).to(hf_device)
        # variant -> (compute dtype, attention, matmul precision)
        variants = {"einsum fp32": ("float32", "einsum", None),
                    "einsum fp32 highest": ("float32", "einsum", "highest"),
                    "xla fp32": ("float32", "xla", None),
                    f"{fused16} bf16": ("bfloat16", fused16, None),
                    "einsum bf16": ("bfloat16", "einsum", None)}
        models = {name: load_pretrained(folder, compute_dtype=dt, attention=att,
                                        scan_layers=True)  # as the configs run them
                  for name, (dt, att, _) in variants.items()}

        # log-probs of right-padded rows (each row's real tokens first)
        lengths = s["parity_lengths"]
        T, V = max(lengths), BENCH_SHAPE["vocab_size"]
        rng = np.random.default_rng(1)
        mask = (np.arange(T)[None] < np.asarray(lengths)[:, None]).astype(np.int32)
        ids = (rng.integers(0, V, (len(lengths), T)) * mask).astype(np.int32)
        with torch.no_grad():
            logits = hf(torch.tensor(ids, device=hf_device),
                        attention_mask=torch.tensor(mask, device=hf_device)).logits.float()
            ref = torch.log_softmax(logits[:, :-1], -1).gather(
                -1, torch.tensor(ids[:, 1:, None], device=hf_device).long())[..., 0]
        ref = np.concatenate([np.zeros((len(lengths), 1)), ref.cpu().numpy()], axis=1)
        real = mask.astype(bool) & (np.arange(T)[None] > 0)  # position 0 predicts nothing
        logp_fn = nnx.jit(lambda m, x, am: token_logprobs(m, x, am))
        logps = {}
        for name, (_, _, precision) in variants.items():
            with jax.default_matmul_precision(precision):
                logps[name] = np.asarray(logp_fn(models[name], jnp.asarray(ids), jnp.asarray(mask)))
        pairs = [(name, "transformers fp32") for name in variants] + [
            ("xla fp32", "einsum fp32"), (f"{fused16} bf16", "einsum bf16")]
        for a, b in pairs:
            other = ref if b == "transformers fp32" else logps[b]
            result["logprobs"].append({"a": a, "b": b, **_diff(logps[a], other, real)})
        result["rows"] = {"lengths": lengths, "padded_to": T}
        out.update(result=result)

        # greedy decoding: our sampler against transformers (fp32), fused against einsum (bf16)
        prompts = [rng.integers(0, V, n).tolist() for n in s["greedy_lengths"]]
        new = s["greedy_new"]
        expected = []
        with torch.no_grad():
            for p in prompts:
                x = torch.tensor([p], device=hf_device)
                y = hf.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                max_new_tokens=new, min_new_tokens=new, pad_token_id=0)
                expected.append(y[0, len(p):].tolist())
        ours = {name: Sampler().generate(models[name], prompts, new, temperature=0.0).tokens
                for name in ("einsum fp32", "xla fp32", f"{fused16} bf16", "einsum bf16")}
        for a, b, ref_tokens in (("einsum fp32", "transformers fp32", expected),
                                 ("xla fp32", "transformers fp32", expected),
                                 (f"{fused16} bf16", "einsum bf16", ours["einsum bf16"])):
            result["greedy"].append({
                "a": a, "b": b, "prefill": prefill_path(models[a]), "prompts": len(prompts),
                "new_tokens": new, **_agreement(ours[a], ref_tokens)})
        result["greedy_prompt_lengths"] = s["greedy_lengths"]
    return result


def _agreement(tokens: list, expected: list) -> dict:
    """Prompts whose tokens agree, and the first differing position of each (None: none)."""
    first = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y),
                  None if len(a) == len(b) else min(len(a), len(b)))
             for a, b in zip(tokens, expected)]
    return {"agree": sum(f is None for f in first), "first_difference": first}


def part_plan(s: dict, out: ChildOutput) -> dict:
    """`plan()` of each family's config on one device (compiled on this device's backend), for
    the architecture of the iterations' shape (its preset; 'tiny' for the tiny shape)."""
    from hgpo_jax.commands.plan import use_plan_xla_flags

    use_plan_xla_flags(1)  # before JAX starts: as `hgpo-jax plan` compiles
    from experiments.benchmarks import bench_iteration as bi
    from hgpo_jax.config import load_config
    from hgpo_jax.trainers.plan import plan, plan_json

    shape = s["shape"]
    overrides = [*bi.ONE_DEVICE, f"model.path={bi.PRESET_SHAPES.get(shape, shape)}",
                 *bi.SHAPE_OVERRIDES[shape], *s["plan_overrides"]]
    result = {"overrides": overrides, "sampler": s["plan_sampler"], "configs": []}
    for family, algo, config in FAMILIES:
        rec = {"family": family, "algorithm": algo, "config": config}
        t0 = time.perf_counter()
        try:
            p = plan(load_config(config, overrides), sampler=s["plan_sampler"])
            rec.update(train_step_peak_bytes=p["peak_bytes"],
                       sampler_peak_bytes=p.get("sampler_peak_bytes"),
                       planned_peak_bytes=max(p["peak_bytes"], p.get("sampler_peak_bytes") or 0),
                       plan=plan_json(p))
        except Exception as exc:  # noqa: BLE001 - one config's failure leaves the others
            rec["error"] = f"{type(exc).__name__}: {exc}"
        rec["wall_s"] = round(time.perf_counter() - t0, 2)
        result["configs"].append(rec)
        out.update(result=result)
    return result


def part_model(s: dict, out: ChildOutput) -> dict:
    from experiments.benchmarks import bench_iteration as bi

    folder = s["model_dir"] or bi.default_model_dir(s["shape"])
    existed = os.path.isfile(os.path.join(folder, "config.json"))
    bi.build_model_folder(folder, s["shape"])
    return {"folder": folder, "shape": s["shape"], "reused": existed}


def part_iteration(s: dict, out: ChildOutput, algo: str) -> dict:
    """One bench_iteration run of the family's config (its whole result)."""
    from experiments.benchmarks import bench_iteration as bi

    config = next(c for _, a, c in FAMILIES if a == algo)
    folder = s["model_dir"] or bi.default_model_dir(s["shape"])
    return bi.main(["--shape", s["shape"], "--model-dir", folder, "--config", config,
                    "--min-prompt-tokens", str(s["min_prompt_tokens"]),
                    *s["iteration_overrides"]])


def part_decode(s: dict, out: ChildOutput) -> dict:
    """probe_decode at the rollout's shape, its bound at the device's bandwidth."""
    from experiments.benchmarks import bench_iteration as bi
    import jax
    from experiments.benchmarks import probe_decode

    # the bandwidth: a GPU's known one (its 16-bit peaks); a CPU's measured (a float32 matmul
    # for the FLOP/s, which the probe does not use, as a CPU's bf16 matmul is slow)
    peaks = bi.device_peaks("bfloat16" if jax.default_backend() == "gpu" else "float32")
    argv = ["--shape", s["decode_shape"], "--param-dtype", "float32", "--new",
            str(s["decode_new"]), "--grid", s["decode_grid"], "--decode", "einsum,ragged",
            "--peak-bw", str(peaks["bw"])]
    return {"command": "python -m experiments.benchmarks.probe_decode " + " ".join(argv), "peaks": peaks,
            "points": probe_decode.main(argv)}


def child_main(name: str, spec_path: str, result_path: str) -> int:
    """Run one part; its result (and partial results on the way) go to `result_path`."""
    with open(spec_path) as f:
        spec = json.load(f)
    out = ChildOutput(result_path)
    try:
        if name.startswith("iteration:"):
            result = part_iteration(spec, out, name.split(":", 1)[1])
        else:
            result = {"parity": part_parity, "plan": part_plan, "model": part_model,
                      "decode": part_decode}[name](spec, out)
        out.update(status="ok", result=result, device=device_info(),
                   device_peak_bytes=device_peak_bytes())
        return 0
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which carries on
        traceback.print_exc()
        out.update(status="failed", error=f"{type(exc).__name__}: {exc}")
        return 1


# =========================================================================== the parent
def write_json(path: str, data) -> None:
    """Write atomically (a reader never sees half a file)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, default=str)
    os.replace(tmp, path)


def _die_with_parent():
    """A `preexec_fn` that has the child SIGKILLed when the parent dies (Linux's
    PR_SET_PDEATHSIG; resolved here, so that the forked child only makes the call), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, signal.SIGKILL)


def _kill_group(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM the child's process group, SIGKILL what is left after `grace` s (its env
    workers too, also when the child itself has exited)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _children_cpu_s() -> float:
    """CPU seconds (user + system) of the waited-for child processes so far."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_part(name: str, spec: dict, timeout: float) -> dict:
    """Run a part in a child process of its own session; returns its record (status ok, failed,
    timeout or interrupted; its result, partial when it did not finish). KeyboardInterrupt
    propagates after the child's group is killed, with the record in its `record` attribute."""
    tail: collections.deque = collections.deque(maxlen=40)
    t0, cpu0 = time.monotonic(), _children_cpu_s()
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        spec_path, result_path = os.path.join(tmp, "spec.json"), os.path.join(tmp, "result.json")
        write_json(spec_path, spec)
        proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--child", name, "--spec", spec_path,
             "--result", result_path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, errors="replace", start_new_session=True, cwd=ROOT,
            env=part_env(name, spec["smoke"]), preexec_fn=_die_with_parent())

        def pump():
            for line in proc.stdout:
                tail.append(line.rstrip("\n"))
                print(f"[{name}] {line}", end="", flush=True)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        interrupted = None
        try:
            rc = proc.wait(timeout)
            status = "ok" if rc == 0 else "failed"
        except subprocess.TimeoutExpired:
            status = "timeout"
        except KeyboardInterrupt as exc:
            status, interrupted = "interrupted", exc
        finally:
            _kill_group(proc)
            reader.join(5)
        child = {}
        if os.path.isfile(result_path):
            with open(result_path) as f:
                child = json.load(f)
    record = part_record(name, status, proc.returncode, time.monotonic() - t0, timeout,
                         _children_cpu_s() - cpu0, child)
    if status != "ok":
        record["log_tail"] = list(tail)
    if interrupted is not None:
        interrupted.record = record
        raise interrupted
    return record


def part_record(name: str, status: str, returncode: int | None, wall_s: float,
                timeout: float | None, cpu_s: float | None, child: dict) -> dict:
    """A part's record from what its child wrote (`ChildOutput`'s data: result, device, peak,
    error) and how it ended."""
    record = {"name": name, "status": status, "returncode": returncode,
              "wall_s": round(wall_s, 2),
              "timeout_s": None if timeout is None else round(timeout, 1),
              "cpu_s": None if cpu_s is None else round(cpu_s, 2),
              **{k: child[k] for k in ("result", "device", "device_peak_bytes", "error")
                 if k in child}}
    if status == "timeout":
        record["reason"] = f"killed after its {timeout:.0f} s timeout"
    elif status == "failed" and "error" not in record:
        record["error"] = f"exit code {returncode}"
    return record


def run_part_here(name: str, spec: dict) -> dict:
    """Run a part in this process instead of a child (no timeout, no device peak of its own, the
    environment of this process): its record as `run_part` makes it. For tests of the parts'
    code and for debugging; the check itself always runs `run_part`."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        spec_path, result_path = os.path.join(tmp, "spec.json"), os.path.join(tmp, "result.json")
        write_json(spec_path, spec)
        rc = child_main(name, spec_path, result_path)
        with open(result_path) as f:
            child = json.load(f)
    return part_record(name, "ok" if rc == 0 else "failed", rc, time.monotonic() - t0, None, None,
                       child)


def versions() -> dict:
    out = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, capture_output=True, text=True, timeout=10)
        out["hgpo_jax_commit"] = (commit.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
                                  if commit.returncode == 0 else None)
    except (OSError, subprocess.SubprocessError):
        out["hgpo_jax_commit"] = None
    return out


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _part_kind(name: str) -> str:
    return "iteration" if name.startswith("iteration:") else name


def selected_parts(spec: str) -> list[str]:
    """--parts: names of PART_ORDER, 'iterations' (model + the three), or an algorithm."""
    names = []
    for item in filter(None, (x.strip() for x in spec.split(","))):
        if item == "iterations":
            names += ["model", *ITERATIONS]
        elif item in PART_ORDER:
            names.append(item)
        elif f"iteration:{item}" in ITERATIONS:
            names.append(f"iteration:{item}")
        else:
            raise SystemExit(f"--parts: unknown part {item!r}; use {', '.join(PART_ORDER)}, "
                             f"iterations or {', '.join(a for _, a, _ in FAMILIES)}")
    return list(dict.fromkeys(names))


# =========================================================================== the report
def _section(record: dict | None) -> dict:
    """A part's record as its report section: status (and why), then its result."""
    if record is None:
        return {"status": "not requested"}
    head = {k: record[k] for k in ("status", "reason", "error", "wall_s", "device_peak_bytes",
                                   "log_tail") if k in record}
    return {**head, **(record.get("result") or {})}


def iteration_records(records: dict) -> list[dict]:
    """One record per family, whatever happened to it; device_peak_bytes always present."""
    out = []
    for family, algo, config in FAMILIES:
        rec = records.get(f"iteration:{algo}")
        section = _section(rec)
        section.update(family=family, algorithm=algo, config=config,
                       device_peak_bytes=(rec or {}).get("device_peak_bytes"))
        out.append(section)
    return out


def plan_section(record: dict | None, iterations: list[dict]) -> dict:
    """The plan part's configs, each with the measured device peak of its family's iteration."""
    section = _section(record)
    measured = {it["algorithm"]: it.get("device_peak_bytes") for it in iterations}
    for rec in section.get("configs", []):
        peak = measured.get(rec["algorithm"])
        rec["measured_peak_bytes"] = peak
        planned = rec.get("planned_peak_bytes")
        rec["measured_over_planned"] = peak / planned if peak and planned else None
    return section


def assemble(meta: dict, records: dict) -> dict:
    """The report: meta (command, times, versions, ...), the device (from the first part that
    saw it), the parts' log, and the sections parity, plan, iterations, decode."""
    report = dict(meta)
    report["device"] = next((r["device"] for r in records.values() if r.get("device")), None)
    report["parts"] = [{k: r[k] for k in ("name", "status", "reason", "error", "returncode",
                                          "wall_s", "cpu_s", "timeout_s") if k in r}
                       for r in records.values()]
    iterations = iteration_records(records)
    report["parity"] = _section(records.get("parity"))
    report["plan"] = plan_section(records.get("plan"), iterations)
    report["iterations"] = iterations
    report["decode"] = _section(records.get("decode"))
    return report


def _gib(x) -> str:
    return "-" if x is None else f"{x / GIB:.2f}"


def _cell(text) -> str:
    """Text for a table cell: one line, no column breaks."""
    return " ".join(str(text or "").split()).replace("|", "\\|")


def _num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def markdown(report: dict) -> str:
    """The report as markdown tables (what to commit beside the JSON)."""
    dev = report.get("device") or {}
    v = report["versions"]
    lines = [f"# gpu_check: {dev.get('device_kind', 'no device seen')} "
             f"({dev.get('backend', '?')}, {dev.get('device_count', '?')} device(s))", "",
             f"`{report['command']}`; started {report['started']}, {report['wall_s']:.0f} s of "
             f"a {report['budget_s']:.0f} s budget" + (" (smoke: tiny shapes)"
                                                       if report["smoke"] else "") + ".",
             f"Python {v['python']}, jax {v['jax']}, jaxlib {v['jaxlib']}, flax {v['flax']}, "
             f"transformers {v['transformers']}, torch {v['torch']}; hgpo_jax "
             f"{v.get('hgpo_jax_commit')}.", "",
             "| part | status | wall s | cpu s | device peak GiB | note |",
             "|---|---|---|---|---|---|"]
    peaks = {it["algorithm"]: it.get("device_peak_bytes") for it in report["iterations"]}
    for p in report["parts"]:
        algo = p["name"].split(":", 1)[1] if p["name"].startswith("iteration:") else None
        lines.append(f"| {p['name']} | {p['status']} | {_num(p.get('wall_s'), '.1f')} | "
                     f"{_num(p.get('cpu_s'), '.1f')} | {_gib(peaks.get(algo))} | "
                     f"{_cell(p.get('reason') or p.get('error'))} |")

    par = report["parity"]
    lines += ["", f"## Parity ({par['status']})", ""]
    if par.get("logprobs"):
        lines += [f"{par.get('note', '')}. Log-probs of right-padded rows of lengths "
                  f"{par['rows']['lengths']}; transformers on {par['transformers_device']}.", "",
                  "| a | b | max abs | mean abs | positions |", "|---|---|---|---|---|"]
        lines += [f"| {r['a']} | {r['b']} | {r['max_abs']:.3g} | {r['mean_abs']:.3g} | "
                  f"{r['positions']} |" for r in par["logprobs"]]
    if par.get("greedy"):
        lines += ["", "| greedy: a | b | prefill | prompts agreeing | first difference |",
                  "|---|---|---|---|---|"]
        lines += [f"| {r['a']} | {r['b']} | {r['prefill']} | {r['agree']} / {r['prompts']} "
                  f"({r['new_tokens']} tokens) | {r['first_difference']} |"
                  for r in par["greedy"]]

    plan = report["plan"]
    lines += ["", f"## Plan against the measured peak ({plan['status']})", ""]
    if plan.get("configs"):
        lines += ["| config | planned peak GiB (train step / sampler) | measured peak GiB "
                  "| measured / planned | plan s |", "|---|---|---|---|---|"]
        for r in plan["configs"]:
            planned = (f"{_gib(r.get('planned_peak_bytes'))} "
                       f"({_gib(r.get('train_step_peak_bytes'))} / "
                       f"{_gib(r.get('sampler_peak_bytes'))})" if "error" not in r
                       else _cell(f"error: {r['error']}"))
            lines.append(f"| `{r['config']}` | {planned} | {_gib(r['measured_peak_bytes'])} | "
                         f"{_num(r['measured_over_planned'], '.2f')} | {r['wall_s']} |")
        lines += ["", f"Overrides: `{' '.join(plan['overrides'])}`."]

    lines += ["", "## Iterations", "",
              "| family | config | status | steps | iteration s | rollout s | update s "
              "| update MFU | decode bound/wall | env steps / rollout | device peak GiB |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for it in report["iterations"]:
        phases = {p["name"]: p for p in it.get("phases", [])}
        update = next((p for n, p in phases.items() if n.startswith("update (")), {})
        decode = phases.get("decode", {})
        metrics = it.get("metrics", {})
        lines.append(
            f"| {it['family']} | `{it['config']}` | {it['status']} | "
            f"{_num(it.get('env_steps_run'), 'd')} | {_num(it.get('iteration_s'), '.1f')} | "
            f"{_num(metrics.get('time/rollout'), '.1f')} | {_num(update.get('wall'), '.1f')} | "
            f"{_num(it.get('update_mfu'), '.1%')} | {_num(decode.get('fraction'), '.1%')} | "
            f"{_num(it.get('env_step_share_of_rollout'), '.1%')} | "
            f"{_gib(it.get('device_peak_bytes'))} |")

    dec = report["decode"]
    lines += ["", f"## Decode ({dec['status']})", ""]
    if dec.get("points"):
        lines += [f"Bound at {dec['peaks']['bw'] / 1e9:.0f} GB/s ({dec['peaks']['source']}).", "",
                  "| decode | weights | rows x prompt, new | ms per step | bound ms, all slots "
                  "| bound ms, real tokens | real-token bound/wall | prefill s |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['decode']} | {r['param_dtype']} | {r['rows']} x {r['prompt']}, "
                  f"{r['new']} | {r['decode_ms_per_step']:.2f} | {r['bound_ms_all_slots']:.2f} | "
                  f"{r['bound_ms_real_tokens']:.2f} | {r['real_bound_over_wall']:.0%} | "
                  f"{r['prefill_s']:.2f} |" for r in dec["points"]]
    return "\n".join(lines) + "\n"


def write_report(path: str, report: dict) -> None:
    """The report's JSON at `path` and its markdown beside it (`.md`)."""
    write_json(path, report)
    with open(os.path.splitext(path)[0] + ".md", "w") as f:
        f.write(markdown(report))


# =========================================================================== main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("overrides", nargs="*", help="config key=value overrides for the iterations "
                   "and the plan (docs/config.md)")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the toy env (a CPU check)")
    p.add_argument("--out", default="", help="the JSON (and .md beside it); default "
                   "docs/results/gpu/gpu_check_<UTC time>[_smoke].json")
    p.add_argument("--budget-s", type=float, default=540.0,
                   help="wall-clock budget, checked before each part (default 540)")
    p.add_argument("--grace-s", type=float, default=30.0,
                   help="how long a running part may go past the budget before it is killed")
    p.add_argument("--parts", default=",".join(PART_ORDER),
                   help="comma-separated parts, in the order to run them (also: iterations, "
                   "hgpo_k2, ppo, hiper)")
    p.add_argument("--env", choices=("alfworld", "toy"), default=None,
                   help="the iterations' env (default alfworld; --smoke: toy)")
    p.add_argument("--shape", default=None, help="bench_iteration's --shape (default 1.5b; "
                   "--smoke: tiny)")
    p.add_argument("--model-dir", default="", help="the iterations' random model folder "
                   "(default bench_iteration's)")
    p.add_argument("--steps", type=int, default=2, help="env steps per iteration (default 2: "
                   "one 256-row mini-batch of the 1.5B configs)")
    p.add_argument("--min-prompt-tokens", type=int, default=None,
                   help="bench_iteration's prompt floor (default 1536; --smoke: 0)")
    p.add_argument("--plan-sampler", action="store_true", help="also plan the rollout's sampler")
    p.add_argument("--decode-grid", default="", help="probe_decode's rows x prompt tokens "
                   "(RxP or RxA-B; default 128x2048; --smoke: 2x9-32)")
    p.add_argument("--decode-new", type=int, default=0,
                   help="new tokens per decode row (default 512; --smoke: 8)")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    p.add_argument("--spec", default="", help=argparse.SUPPRESS)
    p.add_argument("--result", default="", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def run_meta(args, argv: list[str], names: list[str], spec: dict) -> dict:
    """The report's head: the command, the settings, versions, host and environment."""
    return {"script": "experiments/gpu_check.py",
            "command": "python experiments/gpu_check.py " + " ".join(argv),
            "smoke": args.smoke, "started": _now(), "finished": None, "wall_s": 0.0,
            "budget_s": args.budget_s, "grace_s": args.grace_s, "requested_parts": names,
            "settings": spec, "versions": versions(),
            "host": {"cpus": os.cpu_count(), "load_average": list(os.getloadavg())},
            "env_vars": {k: os.environ.get(k) for k in (
                "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_FLAGS",
                "JAX_PLATFORMS", "CUDA_VISIBLE_DEVICES")}}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args.child, args.spec, args.result)
    names = selected_parts(args.parts)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = os.path.abspath(args.out or os.path.join(
        ROOT, "docs", "results", "gpu", f"gpu_check_{stamp}{'_smoke' if args.smoke else ''}.json"))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    spec = settings(args)
    t0 = time.monotonic()
    meta = run_meta(args, sys.argv[1:] if argv is None else argv, names, spec)
    records: dict[str, dict] = {}

    def save():
        meta["wall_s"] = round(time.monotonic() - t0, 1)
        meta["finished"] = _now()
        meta["host"]["load_average_end"] = list(os.getloadavg())
        write_report(out, assemble(meta, records))

    previous = {sig: signal.signal(sig, signal.default_int_handler)  # SIGTERM/SIGHUP as Ctrl-C
                for sig in (signal.SIGTERM, signal.SIGHUP)}
    code = 0
    try:
        for name in names:
            (need, cap) = PART_SECONDS[_part_kind(name)][1 if args.smoke else 0]
            left = args.budget_s - (time.monotonic() - t0)
            if left < need:
                records[name] = {"name": name, "status": "skipped",
                                 "reason": f"{max(left, 0):.0f} s of the budget left, under the "
                                           f"{need} s this part needs"}
            else:
                print(f"== {name} ({left:.0f} s of the budget left)", flush=True)
                records[name] = run_part(name, spec, min(cap, left + args.grace_s))
                print(f"== {name}: {records[name]['status']} in {records[name]['wall_s']:.1f} s",
                      flush=True)
            save()
    except KeyboardInterrupt as exc:
        code = 130
        if getattr(exc, "record", None):
            records[exc.record["name"]] = exc.record
        for name in names:
            records.setdefault(name, {"name": name, "status": "skipped",
                                      "reason": "the check was interrupted"})
        print("interrupted: the parts run so far are in the report", file=sys.stderr)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        save()
    print(f"wrote {out} and {os.path.splitext(out)[0]}.md ({time.monotonic() - t0:.0f} s)")
    return code


if __name__ == "__main__":
    sys.exit(main())
