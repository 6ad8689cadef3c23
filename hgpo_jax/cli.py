"""The `hgpo-jax` command line.

    hgpo-jax train CONFIG|RUN_DIR [key=value ...] [--resume [--allow-change]]
        Train (CONFIG: a name from experiments/configs, or a YAML path). Metrics go to
        RUN_DIR/metrics.jsonl and RUN_DIR/tb, checkpoints to RUN_DIR/checkpoints; `train RUN_DIR
        --resume` goes on with a run where its folder lies (docs/training.md, "Run folders").
    hgpo-jax eval CONFIG|RUN_DIR [key=value ...] [--split S] [--games N] [--json] [--episodes PATH]
        Success rate (overall and per task type) under eval.protocol at eval.temperature; a
        RUN_DIR evaluates its latest checkpoint (RL or supervised) and records the evaluation in
        RUN_DIR/eval/, never in the run's own record; a CONFIG evaluates its model.path.
    hgpo-jax sft CONFIG [key=value ...] [--resume]
        Supervised warm start (the `sft:` section) on expert episodes, random episodes (the
        reply format only) or a JSONL of {"prompt", "response"} turns; an RL run starts from it
        with model.path=RUN_DIR.
    hgpo-jax export RUN_DIR OUT_DIR [--overwrite] [--critic]
        The latest checkpoint's policy (RL or supervised run) as a Hugging Face folder, into a new
        or empty folder outside any run (--overwrite: replace an earlier export).
    hgpo-jax plan CONFIG [key=value ...]
        Compile the train step ahead of time for the config's mesh and print memory per device.
    hgpo-jax demo [--model DIR|RUN_DIR] [--prompt TEXT] [--max-new-tokens N] [--temperature T]
        Build (or load) a checkpoint (a HF folder of any supported family or a run's latest
        policy), decode a reply
        to a chat prompt with the batched sampler (`hgpo_jax.rl.sampling.generate`; temperature 0,
        greedy, by default), and print it with timings. Without --model a tiny random Qwen2 is
        built locally.
    hgpo-jax demo --model RUN_DIR --episode [--task INDEX] [--split S] [--temperature T]
                  [--max-steps N] [--seed N]
        Watch a run's latest policy play one episode of its env (task INDEX of split S: default
        0 of the env's first evaluation split) with its agent, as its rollouts play: each turn's
        observation, raw reply and parse (the action sent, valid; a plan-execute agent's switch
        and sub-goal), then the reward total, won and the agent's totals (SWITCH turns,
        segments).

train, eval and sft also run as one job of several processes (one per host, each started with the
same command; docs/multihost.md): --coordinator HOST:PORT --num-processes N --process-id I, or
--distributed alone where jax.distributed.initialize() finds the cluster itself (SLURM, TPU pods,
Open MPI, Kubernetes). Process 0 prints and writes the metrics.

Every failure is one line (what was wrong, how to fix it) and exit code 2; --debug shows the
traceback instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hgpo_jax.config import Config
    from hgpo_jax.envs.registry import EnvSpec

DEMO_NEW_TOKENS = 32  # the chat demo's reply length
DEFAULT_PROMPT = ("Your task is to: put a clean mug in coffeemachine. You are in the middle of a "
                  "room. What do you do next?")


def check_demo_model(path: str) -> None:
    """`demo --model PATH`: a Hugging Face folder (config.json) or an hgpo-jax run folder."""
    from hgpo_jax.runs import is_run_dir

    if not os.path.exists(path):
        raise FileNotFoundError(f"--model {path}: the folder does not exist")
    if not (os.path.isfile(os.path.join(path, "config.json")) or is_run_dir(path)):
        raise FileNotFoundError(f"--model {path} is neither a Hugging Face model folder (no "
                                "config.json) nor an hgpo-jax run folder (config.yaml and "
                                "checkpoints/)")


# flags of `demo --episode` only, and of the chat demo only (argparse dest names)
EPISODE_FLAGS = ("task", "split", "max_steps")
CHAT_FLAGS = ("prompt",)


def check_demo_flags(args) -> None:
    """`demo`'s flags that hold in both modes (--max-new-tokens >= 1, --temperature >= 0), and
    no flag of the other mode: --task, --split and --max-steps need --episode; --prompt is the
    chat demo's."""
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens {args.max_new_tokens}: give at least 1")
    if args.temperature < 0:
        raise ValueError(f"--temperature {args.temperature}: give 0 (greedy) or more")
    other = CHAT_FLAGS if args.episode else EPISODE_FLAGS
    given = [f"--{name.replace('_', '-')}" for name in other if getattr(args, name) is not None]
    if given and args.episode:
        raise ValueError(f"{given[0]} is the chat demo's: an episode's prompts are its agent's; "
                         f"drop {given[0]}")
    if given:
        raise ValueError(f"{given[0]} chooses what `demo --episode` plays: add --episode "
                         "(and --model RUN_DIR)")


def cmd_demo(args) -> int:
    check_demo_flags(args)
    if args.episode:
        return demo_episode(args)
    from hgpo_jax.rl.sampling import generate
    from hgpo_jax.runs import load_model

    if args.model is not None:
        check_demo_model(args.model)
    dtype = args.dtype or "float32"
    # a run folder, a HF folder, or "tiny" (built on first use): runs.load_model takes each
    model, tokenizer, folder = load_model(args.model or "tiny", dtype=dtype,
                                          progress=show_progress(args))
    model_dir = args.model or folder
    print(f"model: {model_dir}\n  {model_line(model)}, {dtype}")
    text = DEFAULT_PROMPT if args.prompt is None else args.prompt
    prompt = tokenizer.chat_prompt([{"role": "user", "content": text}])
    t0 = time.perf_counter()
    out = generate(model, [prompt], args.max_new_tokens or DEMO_NEW_TOKENS,
                   temperature=args.temperature, eos_token_id=tokenizer.eos_token_ids,
                   rng=args.seed)
    seconds = time.perf_counter() - t0
    tokens = out.tokens[0]
    run_s = max(seconds - out.compile_s, 1e-9)
    print(f"prompt ({len(prompt)} tokens): {text}")
    print(f"reply  ({len(tokens)} tokens): {tokenizer.decode(tokens)!r}")
    print(f"compile {out.compile_s:.2f}s, generate {run_s:.2f}s "
          f"({len(tokens) / run_s:.1f} tokens/s, prefill included)")
    if args.model is None:
        print("(random weights: the reply is noise; pass --model DIR for a real checkpoint)")
    return 0


def model_line(model) -> str:
    """A model's shape in one line: family, layers, hidden size, heads, vocabulary, parameters."""
    cfg = model.config
    return (f"{cfg.model_type}, {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, heads "
            f"{cfg.num_attention_heads}/{cfg.num_key_value_heads} kv, vocab {cfg.vocab_size}, "
            f"{model.num_params():,} parameters")


@dataclasses.dataclass(frozen=True)
class EpisodeChoice:
    """What `demo --episode` plays, checked before the model loads: the run's config and latest
    checkpoint (kind "rl" or "sft", step), its env's registry entry (with the run's training
    reward), the split, the task's index in it and the task itself, the split's number of tasks
    and the step limit."""

    cfg: Config
    checkpoint: tuple[str, int]
    spec: EnvSpec
    split: str
    index: int
    task: object
    num_tasks: int
    max_steps: int


def choose_episode(args) -> EpisodeChoice:
    """`demo --episode`'s run folder, split, task and step limit, each refused in one line: no
    run folder (--model RUN_DIR) or one without a checkpoint, a split the env lacks (its splits
    named), a task index out of the split's range (the range named), --max-steps < 1. Defaults:
    the env's first evaluation split, task 0, the run's env.max_steps."""
    from hgpo_jax.config import load_config
    from hgpo_jax.envs.registry import get_env, with_reward
    from hgpo_jax.runs import is_run_dir, latest_checkpoint

    if args.model is None or not is_run_dir(args.model):
        got = f" ({args.model} is not one)" if args.model is not None else ""
        raise ValueError(f"--episode plays a run's policy in its env: give --model RUN_DIR, an "
                         f"hgpo-jax run folder (config.yaml and checkpoints/){got}")
    checkpoint = latest_checkpoint(args.model)
    if checkpoint is None:
        raise ValueError(f"--model {args.model}: the run has no checkpoint yet; watch it after its "
                         "first one (train.save_every)")
    cfg = load_config(args.model)
    spec = with_reward(get_env(cfg.env.name), cfg.env.reward)
    split = args.split or (spec.eval_splits or spec.splits)[0]
    if split not in spec.splits:
        raise ValueError(f"--split {split!r}: env {spec.name!r} has the splits "
                         f"{', '.join(spec.splits)}")
    tasks = spec.list_tasks(cfg.env, split)
    index = args.task or 0
    if not 0 <= index < len(tasks):
        have = f"give an index in 0..{len(tasks) - 1}" if tasks else "choose another --split"
        raise ValueError(f"--task {index}: split {split!r} of env {spec.name!r} has {len(tasks)} "
                         f"tasks; {have}")
    max_steps = cfg.env.max_steps if args.max_steps is None else args.max_steps
    if max_steps < 1:
        raise ValueError(f"--max-steps {max_steps}: give at least 1")
    return EpisodeChoice(cfg, checkpoint, spec, split, index, tasks[index], len(tasks), max_steps)


OBSERVATION_CHARS = 600  # longer observations are shown as their start and end


def clip_text(text: str, limit: int = OBSERVATION_CHARS) -> str:
    """`text`, or its first and last limit/2 characters around a note of what was left out."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]} [... {len(text) - 2 * half} characters ...] {text[-half:]}"


def indented(label: str, text: str) -> str:
    """"label: text", the text's later lines indented under the label."""
    return f"{label}: " + str(text).replace("\n", "\n" + " " * (len(label) + 2))


def shown(value: str) -> str:
    """A parsed field as printed: plain text as it is; "" or text with line breaks, other
    unprintable characters or blanks at either end as a Python literal."""
    plain = value and value == value.strip() and value.isprintable()
    return value if plain else repr(value)


def turn_lines(t: int, turn, fields: dict[str, str]) -> list[str]:
    """One turn of `demo --episode` (t 0-based; turn: a `WatchedTurn`; fields: the agent's
    `describe` of its reply): a header, the observation (clipped), the prompt's length, the raw
    reply (a Python literal), the parsed fields (`shown`), the reward and done."""
    return [f"--- turn {t + 1} ---", indented("observation", clip_text(turn.observation)),
            f"prompt: {turn.prompt_tokens} tokens", f"reply: {turn.reply!r}",
            *(f"  {name}: {shown(value)}" for name, value in fields.items()),
            f"  reward: {turn.reward:g}", f"  done: {turn.done}"]


def episode_lines(episode, totals: dict[str, str]) -> list[str]:
    """The end of `demo --episode`: the turns played, the reward total, won, the env's score
    where it has one, and the agent's totals (`describe_episode`)."""
    score = f", score {episode.score:g}" if episode.score is not None else ""
    return [f"=== episode: {len(episode.turns)} turns, reward total {episode.reward:g}, "
            f"won {episode.won}{score}", *(f"  {name}: {value}" for name, value in totals.items())]


def demo_episode(args) -> int:
    """`demo --episode`: the run's latest policy plays one episode of its env with its agent
    (`hgpo_jax.rl.rollout.watch_episode`), each turn printed as it is played."""
    from hgpo_jax.agents import get_agent
    from hgpo_jax.rl.rollout import Policy, watch_episode
    from hgpo_jax.runs import load_model

    choice = choose_episode(args)
    cfg = choice.cfg
    agent = get_agent(cfg.agent.name, cfg.env.name, projection=cfg.env.projection)
    model, tokenizer, _ = load_model(args.model, dtype=args.dtype, progress=show_progress(args))
    policy = Policy.of_rollout(model, tokenizer, cfg.rollout, args.temperature)
    if args.max_new_tokens is not None:
        policy = dataclasses.replace(policy, max_new_tokens=args.max_new_tokens)
    kind, step = choice.checkpoint
    print(f"run: {args.model} ({'iteration' if kind == 'rl' else 'step'} {step}), "
          f"{model_line(model)}\nagent {agent.name}, env {cfg.env.name}, split {choice.split}, "
          f"task {choice.index} of {choice.num_tasks} ({choice.task}), temperature "
          f"{args.temperature:g}, seed {args.seed}, at most {choice.max_steps} steps, "
          f"{policy.max_new_tokens} new tokens per reply, memory {cfg.env.memory_len} turns",
          flush=True)

    def show(t: int, turn) -> None:
        print("\n".join(turn_lines(t, turn, agent.describe(turn.reply))), flush=True)

    env = choice.spec.make_env(cfg.env)()
    try:
        episode = watch_episode(policy, env, choice.task, choice.max_steps, cfg.env.memory_len,
                                rng=args.seed, spec=choice.spec, agent=agent, on_turn=show)
    finally:
        env.close()
    print(f"task: {episode.task}" if episode.task else "task: (the env gives no task text)")
    print("\n".join(episode_lines(episode, agent.describe_episode(
        [turn.reply for turn in episode.turns]))))
    return 0


def show_progress(args) -> bool:
    """Redrawn progress bars only on a terminal: with stderr redirected (CI, `make run > log`)
    runs print one line per iteration or step instead of tqdm's carriage-return frames."""
    return not getattr(args, "no_progress", False) and sys.stderr.isatty()


def _summary(history: list[dict], start: int = 0) -> str:
    """The per-iteration table printed at the end of a run (held-out success columns included)."""
    columns = {"success/all": "success"}
    for key in sorted({k for m in history for k in m}):
        if key.startswith("eval/") and key.endswith("/all") and key.count("/") == 2:
            columns[key] = key[5:-4]
    columns.update({"rollout/mean_step_reward": "step_reward",
                    "rollout/invalid_action_rate": "invalid_rate", "train/loss": "loss",
                    "train/pg_loss": "pg_loss", "train/kl_loss": "kl_loss",
                    "train/pg_clipfrac": "pg_clipfrac", "train/mean_advantage": "mean_adv",
                    "time/iteration": "seconds"})
    lines = [f"{'iteration':>9} " + " ".join(f"{c:>12}" for c in columns.values())]
    for i, m in enumerate(history, start + 1):
        lines.append(f"{i:>9} " + " ".join(f"{m.get(k, float('nan')):>12.4g}" for k in columns))
    return "\n".join(lines)


def start_distributed(args, cfg) -> bool:
    """Join the multi-process job the command line asks for (--coordinator/--num-processes/
    --process-id, or --distributed), with the config's time-outs; returns whether this is
    process 0 (the one that prints). Before anything starts JAX's backends."""
    from hgpo_jax.distributed import DistributedArgs, detect_launcher, init_distributed

    dist_args = DistributedArgs(args.coordinator, args.num_processes, args.process_id,
                                args.distributed)
    launcher = (None if dist_args.requested or getattr(args, "single_process", False)
                else detect_launcher())
    if launcher:  # started by a multi-process launcher with no flags: join its job
        dist_args = DistributedArgs(auto=True)
    args.multi_process = init_distributed(dist_args, heartbeat_timeout_s=cfg.dist.heartbeat_timeout_s,
                                          init_timeout_s=cfg.dist.init_timeout_s)
    if not args.multi_process:
        return True
    import jax

    if jax.process_index() == 0:
        print(f"{jax.process_count()} processes, {jax.device_count()} devices "
              f"({jax.local_device_count()} per process, {jax.devices()[0].platform})"
              + (f"; launcher detected: {launcher}" if launcher else ""), flush=True)
    return jax.process_index() == 0


def _printer(main: bool):
    """print on process 0, nothing elsewhere."""
    return print if main else (lambda *a, **k: None)


def command_config(args):
    """The config of train, sft and eval: for a run folder (CONFIG names one) its recorded config
    (with what its resumes changed), the folder where it lies, then the overrides; else the config
    name or YAML path with the overrides."""
    from hgpo_jax.config import is_run_folder, load_config, parse_override

    if is_run_folder(args.config):
        moved = [o for o in args.overrides if parse_override(o)[0] == "train.run_dir"]
        if moved:
            raise ValueError(f"{args.config} is a run folder: it is used where it lies; drop "
                             f"{moved[0]} (to start a new run from it: train CONFIG "
                             f"model.path={args.config})")
    return load_config(args.config, args.overrides)


def cmd_train(args) -> int:
    from hgpo_jax.config import format_config
    from hgpo_jax.trainers.checks import check_start
    from hgpo_jax.trainers.rl import Trainer

    cfg = command_config(args)
    say = _printer(start_distributed(args, cfg))
    check_start(cfg, kind="rl", run_dir=cfg.run_path())
    say(format_config(cfg), flush=True)
    with Trainer(cfg, resume=args.resume, progress=show_progress(args),
                 allow_change=args.allow_change) as trainer:
        start = trainer.iteration
        if args.resume:
            say(f"resuming {trainer.run_dir} at iteration {start}", flush=True)
        history = trainer.train()
        say(f"\n{cfg.name}: iterations {start + 1}..{trainer.iteration} "
            f"(run folder {trainer.run_dir})")
        if history:
            say(_summary(history, start))
        if trainer.main:
            report_learning(trainer)
    return 0


def report_learning(trainer) -> None:
    """Start-vs-end success (first vs last third of the iterations) with standard errors: printed,
    logged to metrics.jsonl as summary/..., and the curves drawn to RUN_DIR/learning_curves.png."""
    from hgpo_jax.metrics import read_metrics
    from hgpo_jax.summary import format_summary, learning_summary, plot_learning_curves, summary_metrics

    records = read_metrics(trainer.run_dir)
    summary = learning_summary(records)
    if not summary:
        return
    trainer.logger.log(trainer.iteration, summary_metrics(summary))
    png = plot_learning_curves(trainer.run_dir, records)
    print("\nsuccess, first vs last third of the iterations (mean +/- binomial standard error):")
    print(format_summary(summary))
    print(f"curves: {png}")


def cmd_eval(args) -> int:
    from hgpo_jax.config import is_run_folder
    from hgpo_jax.runs import latest_checkpoint
    from hgpo_jax.trainers.checks import check_output_file, check_start
    from hgpo_jax.trainers.rl import Trainer

    cfg = command_config(args)
    main = start_distributed(args, cfg)  # before latest_checkpoint, which reads checkpoints with JAX
    say = _printer(main)
    check_eval_args(cfg, args.split, args.games, args.episodes)
    splits = [args.split] if args.split else cfg.eval.splits
    check_start(cfg, kind="eval", run_dir=None, eval_splits=splits)
    if args.episodes:
        check_output_file(args.episodes, "--episodes")
    run = os.path.abspath(args.config) if is_run_folder(args.config) else None
    found = latest_checkpoint(run) if run else None
    if run and found is None:
        raise ValueError(f"{args.config} has no checkpoint to evaluate yet; evaluate it after its "
                         "first checkpoint (train.save_every), or evaluate its CONFIG")
    if found:  # the run's latest weights as the model (runs.load_model reads a run folder)
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=run))
    e = cfg.eval
    how = (f"{e.batches} batches x {e.batch_size} episodes per seed, seeds {e.seeds}"
           if e.protocol == "verl-agent" else "each game once")
    what = f"{run} at {'iteration' if found[0] == 'rl' else 'step'} {found[1]}" if found else (
        f"{cfg.name}'s model.path {cfg.model.path}")
    say(f"evaluating {what}: protocol {e.protocol} ({how}), temperature {e.temperature}", flush=True)
    results, episodes = {}, []
    # where the evaluation is recorded: the run's eval/; a config's model, in train.run_dir/eval/
    # unless that folder holds a run (another model: then nothing is recorded)
    home = run or (None if is_run_folder(cfg.run_path()) else os.path.abspath(cfg.run_path()))
    label = f"{found[0]}{found[1]}" if found else "model"
    record = eval_record_path(home, label) if home else None
    with Trainer(cfg, progress=show_progress(args), record=False) as trainer:
        for split in splits:
            if args.episodes:
                rates, played = trainer.evaluate_episodes(split, args.games or None)
                episodes += [{"split": split, **dataclasses.asdict(ep)} for ep in played]
                results.update(rates)
            else:
                results.update(trainer.evaluate(split, args.games or None))
            if record and main:  # each split's results kept at once, beside the settings they had
                write_eval_record(record, found, cfg, args, results)
    if main:
        say(f"recorded in {record}" if record else f"not recorded: {cfg.run_path()} holds a run "
            "(evaluate that run with hgpo-jax eval RUN_DIR)")
    if args.episodes and main:
        write_episodes(args.episodes, episodes)
        say(f"wrote {len(episodes)} episodes to {args.episodes}")
    for k, v in results.items():
        say(f"  {k:<60} {v:.4f}")
    if args.json:
        say(json.dumps(eval_json(results, splits)))
    return 0


EVAL_FOLDER = "eval"  # evaluations: RUN_DIR/eval/<time>-<kind><step>.json and metrics.jsonl


def eval_record_path(folder: str, label: str) -> str:
    """A new FOLDER/eval/<started>-<label>[-n].json for one evaluation (label: the checkpoint's
    kind and step, e.g. rl12, or "model" for a config's model.path)."""
    base = os.path.join(folder, EVAL_FOLDER, f"{time.strftime('%Y%m%d-%H%M%S')}-{label}")
    path, n = base + ".json", 1
    while os.path.exists(path):
        n += 1
        path = f"{base}-{n}.json"
    return path


def write_eval_record(path: str, found: tuple[str, int] | None, cfg, args, results: dict) -> None:
    """An evaluation, beside a run's own record (which it never touches): `path` holds the
    command, the checkpoint (`found`: kind and step; None for a config's model.path), the whole
    config it ran under and its results (rewritten atomically as each split's come in), and
    eval/metrics.jsonl gets them at the checkpoint's step (0 for a config's model; records of one
    step merge when read)."""
    from hgpo_jax.config import config_to_dict
    from hgpo_jax.metrics import MetricsLogger, write_atomically

    kind, step = found or ("model", 0)
    record = {"folder": os.path.dirname(os.path.dirname(path)), "kind": kind, "step": step,
              "model.path": cfg.model.path,
              "time": time.time(), "split": args.split, "games": args.games,
              "overrides": list(args.overrides), "results": results, "config": config_to_dict(cfg)}
    write_atomically(path, (json.dumps(record, indent=1) + "\n").encode("utf-8"))
    logger = MetricsLogger(os.path.dirname(path), tensorboard=False)
    try:
        logger.log(step, results)
    finally:
        logger.close()


def write_episodes(path: str, records: list[dict]) -> None:
    """`eval --episodes PATH`: one JSON object per episode per line, written atomically (a crash
    leaves the old file or the new one)."""
    from hgpo_jax.metrics import write_atomically

    write_atomically(path, "".join(json.dumps(r, default=str) + "\n" for r in records).encode("utf-8"))


def check_eval_args(cfg, split: str | None, games: int, episodes: str | None = None) -> None:
    """`eval`'s flags against the config, before anything heavy starts: --split one of the env's
    splits, --games >= 0 and --games and --episodes only under the each-once protocol (which plays
    N games, each once)."""
    from hgpo_jax.envs.registry import get_env

    splits = get_env(cfg.env.name).splits
    if split is not None and split not in splits:
        raise ValueError(f"--split {split!r}: env {cfg.env.name!r} has the splits {', '.join(splits)}")
    if games < 0:
        raise ValueError(f"--games {games}: give a number of games >= 1 (or 0: eval.games)")
    if games and cfg.eval.protocol != "each-once":
        raise ValueError(f"--games {games} counts the games of eval.protocol=each-once; this config "
                         f"evaluates under {cfg.eval.protocol!r} (eval.seeds x eval.batches x "
                         "eval.batch_size episodes): add eval.protocol=each-once, or set those keys")
    if episodes and cfg.eval.protocol != "each-once":
        raise ValueError(f"--episodes writes one line per game of eval.protocol=each-once; this config "
                         f"evaluates under {cfg.eval.protocol!r}: add eval.protocol=each-once")


def eval_json(results: dict[str, float], splits: list[str]) -> dict[str, dict]:
    """`eval --json`'s object: per split evaluated, 'score' (mean task score, None where the env
    has none), 'success', 'episodes' and every other rate of that split by its short name (task
    types, 'mean_length', 'ended', 'failed', 'all_std', ...). NaN becomes None (JSON has no NaN)."""
    out = {}
    for split in splits:
        prefix = f"eval/{split}/"
        rates = {k[len(prefix):]: (None if v != v else float(v)) for k, v in results.items()
                 if k.startswith(prefix)}
        out[split] = {"score": rates.pop("score", None), "success": rates.pop("all", None),
                      "episodes": int(rates.pop("episodes", 0) or 0), **rates}
    return out


def cmd_sft(args) -> int:
    from hgpo_jax.config import format_config
    from hgpo_jax.trainers.checks import check_start
    from hgpo_jax.trainers.sft import SftTrainer

    cfg = command_config(args)
    say = _printer(start_distributed(args, cfg))
    check_start(cfg, kind="sft", run_dir=cfg.run_path())
    say(format_config(cfg), flush=True)
    with SftTrainer(cfg, resume=args.resume, progress=show_progress(args),
                    allow_change=args.allow_change) as trainer:
        start = trainer.step
        info = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
                         for k, v in trainer.data_info.items())
        say(f"supervised data: {info}", flush=True)
        if args.resume:
            say(f"resuming {trainer.run_dir} at step {start}", flush=True)
        before = trainer.heldout_nll() if start == 0 and trainer.has_heldout else None
        history = trainer.train()
        say(f"\n{cfg.name}: steps {start + 1}..{trainer.step} (run folder {trainer.run_dir})")
        evals = [(start + i + 1, m) for i, m in enumerate(history) if "heldout/nll" in m]
        if not trainer.has_heldout:
            say("  no held-out loss (sft.heldout=0): every episode is trained on"
                + (f"; last train NLL {history[-1]['train/nll']:.4f}" if history else ""))
        elif start == 0:
            say(f"  held-out NLL per response token: {before:.4f} before training")
        for step, m in evals:
            say(f"  step {step:>6}: train NLL {m['train/nll']:.4f}, held-out NLL {m['heldout/nll']:.4f}")
        say(f"start an RL run from it with model.path={trainer.run_dir}")
    return 0


def cmd_export(args) -> int:
    from hgpo_jax.models import save_pretrained
    from hgpo_jax.runs import check_export_folder, is_run_dir, load_model, write_export_record

    if not is_run_dir(args.run_dir):
        raise FileNotFoundError(f"{args.run_dir} is not a run folder (no config.yaml and "
                                "checkpoints/)")
    check_export_folder(args.run_dir, args.out_dir, args.overwrite)
    if args.critic:
        from hgpo_jax.runs import load_run_state_model

        model, tokenizer = load_run_state_model(args.run_dir, progress=show_progress(args))
    else:
        model, tokenizer, _ = load_model(args.run_dir, progress=show_progress(args))
    out = save_pretrained(model, args.out_dir, tokenizer=tokenizer, overwrite=args.overwrite)
    write_export_record(out, args.run_dir, "critic" if args.critic else "policy")
    print(f"exported the latest checkpoint's {'critic' if args.critic else 'policy'} of "
          f"{args.run_dir} to {out}")
    return 0


def cmd_plan(args) -> int:
    from hgpo_jax.config import load_config
    from hgpo_jax.trainers.plan import devices_needed, format_plan, plan, plan_json

    cfg = load_config(args.config, args.overrides)
    need = devices_needed(cfg)
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:  # before JAX starts its backends
        # Virtual CPU devices for the mesh; no LLVM optimization: a plan never runs the code,
        # and buffer sizes are fixed before code generation (same numbers, faster compile).
        flags += (f" --xla_force_host_platform_device_count={need}"
                  " --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true")
        os.environ["XLA_FLAGS"] = flags.strip()
    result = plan(cfg, target=args.target, sampler=args.sampler)
    print(json.dumps(plan_json(result)) if args.json else format_plan(result))
    return 0


def _add_dist_flags(p) -> None:
    """The multi-process flags of train, eval and sft (docs/multihost.md)."""
    g = p.add_argument_group("multi-process (one process per host; docs/multihost.md)")
    g.add_argument("--coordinator", metavar="HOST:PORT",
                   help="address of process 0's coordination service (same on every process)")
    g.add_argument("--num-processes", type=int, metavar="N", help="processes in the job")
    g.add_argument("--process-id", type=int, metavar="I", help="this process's index, 0..N-1")
    g.add_argument("--distributed", action="store_true",
                   help="let jax.distributed.initialize() detect the cluster (SLURM, TPU, Open "
                        "MPI, Kubernetes); the flags above, where given, take precedence. "
                        "Without any flag a launch of several processes by srun, mpirun, "
                        "a multi-host TPU VM or JAX_NUM_PROCESSES>1 is joined the same way")
    g.add_argument("--single-process", action="store_true",
                   help="run alone even under a multi-process launcher (no auto-detection)")


def _add_run_command(sub, name: str, help: str, example: str, func) -> None:
    """A command that starts or resumes a run from a config (train, sft)."""
    p = sub.add_parser(name, help=help)
    p.add_argument("config", help="config name (experiments/configs) or YAML path")
    p.add_argument("overrides", nargs="*", help=f"key=value overrides, e.g. {example}")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in train.run_dir (or the run folder given as CONFIG) "
                        "from its latest checkpoint")
    p.add_argument("--allow-change", action="store_true",
                   help="with --resume: let the overrides change what the run is (estimator and "
                        "its options, optimizer, model, env, rollouts, data); the change is "
                        "recorded in RUN_DIR/config_changes.jsonl from the restored step on")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    _add_dist_flags(p)
    p.set_defaults(func=func)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hgpo-jax", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run_command(sub, "train", "train a policy", "algo.K=4", cmd_train)
    ev = sub.add_parser("eval", help="success rate of a config's model or a run's checkpoint")
    ev.add_argument("config", help="config name, YAML path or run folder")
    ev.add_argument("overrides", nargs="*")
    ev.add_argument("--split", help="one split instead of the config's eval.splits")
    ev.add_argument("--games", type=int, default=0,
                    help="each-once protocol: games per split (0: eval.games)")
    ev.add_argument("--json", action="store_true",
                    help="also print {split: {score, success, episodes, ...}} as the last line")
    ev.add_argument("--episodes", metavar="PATH",
                    help="each-once protocol: also write every episode (split, index, task, task_type, "
                         "won, score, length, ended) to PATH as JSON lines, for paired comparisons")
    ev.add_argument("--no-progress", action="store_true")
    _add_dist_flags(ev)
    ev.set_defaults(func=cmd_eval)
    _add_run_command(sub, "sft", "supervised warm start on expert episodes or a JSONL", "sft.steps=100",
                     cmd_sft)
    ex = sub.add_parser("export", help="export a run's policy as a Hugging Face folder")
    ex.add_argument("run_dir", help="the run folder")
    ex.add_argument("out_dir", help="a new or empty folder, never one inside a run")
    ex.add_argument("--overwrite", action="store_true",
                    help="replace an earlier export in OUT_DIR (a folder holding only what "
                         "hgpo-jax export wrote, listed in its hgpo_jax_export.json)")
    ex.add_argument("--no-progress", action="store_true")
    ex.add_argument("--critic", action="store_true",
                    help="export a ppo or hiper run's critic (the family's transformers "
                         "...ForTokenClassification, e.g. Qwen2ForTokenClassification)")
    ex.set_defaults(func=cmd_export)
    pl = sub.add_parser("plan", help="compile the train step and print memory per device")
    pl.add_argument("config")
    pl.add_argument("overrides", nargs="*")
    pl.add_argument("--target", choices=("gpu", "tpu", "cpu"), default="gpu",
                    help="the platform the run is for: it decides the attention path "
                         "(model.attention=auto: cuDNN flash on gpu) (default: gpu)")
    pl.add_argument("--sampler", action="store_true",
                    help="also compile the rollout's sampler (prefill and decode) and report its "
                         "memory per device during a rollout")
    pl.add_argument("--json", action="store_true",
                    help="print the plan as one JSON object (the last line of stdout; keys in "
                         "docs/training.md)")
    pl.set_defaults(func=cmd_plan)
    demo = sub.add_parser("demo", help="decode a reply to a prompt, or watch a run's policy "
                                       "play one episode (--episode)")
    demo.add_argument("--model", help="HF model folder or run folder (default: build a tiny "
                                      "random one); with --episode, a run folder")
    demo.add_argument("--prompt", help="the chat prompt (default: an ALFWorld-like request)")
    demo.add_argument("--max-new-tokens", type=int,
                      help=f"tokens per reply (default: {DEMO_NEW_TOKENS}; with --episode the "
                           "run's rollout.max_new_tokens)")
    demo.add_argument("--temperature", type=float, default=0.0,
                      help="sampling temperature (default 0: greedy)")
    demo.add_argument("--seed", type=int, default=0, help="sampling seed (temperature > 0)")
    demo.add_argument("--dtype", choices=["float32", "bfloat16"],
                      help="weights' dtype (default: float32; with --episode the run's "
                           "model.dtype)")
    ep = demo.add_argument_group("episode (--episode)")
    ep.add_argument("--episode", action="store_true",
                    help="play one episode of the run's env with its agent, turn by turn")
    ep.add_argument("--task", type=int, metavar="INDEX",
                    help="the task's index in the split (default 0)")
    ep.add_argument("--split", help="the env's split (default: its first evaluation split)")
    ep.add_argument("--max-steps", type=int, metavar="N",
                    help="step limit (default: the run's env.max_steps)")
    demo.add_argument("--no-progress", action="store_true", help="no progress bars")
    demo.set_defaults(func=cmd_demo)
    for command in sub.choices.values():
        command.add_argument("--debug", action="store_true",
                             help="on an error, show the whole traceback (not one line)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # key=value overrides may also follow the flags (`train tiny_cpu --resume algo.K=4`)
    stray = [a for a in extra if "=" not in a or a.startswith("-")]
    if stray or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    if extra:
        args.overrides = list(args.overrides) + extra
    try:
        return args.func(args)
    except Exception as e:
        if getattr(args, "multi_process", False):
            stop_process(args.command, e)
        if args.debug:
            raise
        print(f"hgpo-jax {args.command}: error: {error_line(e)}", file=sys.stderr)
        return 2


USER_ERRORS = (FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError,
               PermissionError, ValueError)


def error_line(error: Exception) -> str:
    """An error as the one line the CLI prints: its message (a list of problems joined with
    '; '), prefixed by its type and followed by the --debug hint where it is no user error (one
    the checks did not foresee)."""
    from hgpo_jax.checkpoint import CheckpointError

    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = lines[0] + (" " + "; ".join(lines[1:]) if len(lines) > 1 else "") if lines else ""
    if isinstance(error, (*USER_ERRORS, CheckpointError)):
        return text or type(error).__name__
    return f"{type(error).__name__}: {text} (run it again with --debug for the traceback)"
COLLECTIVE_FAILURES = ("Gloo", "NCCL", "heartbeat", "Connection closed", "Connection reset",
                       "UNAVAILABLE", "DEADLINE_EXCEEDED")  # in the errors of a failed collective


def is_collective_failure(error: Exception) -> bool:
    """Whether an exception of a multi-process run comes from a collective that could not complete
    (a peer died, was killed or lost its link); JAX raises these as JaxRuntimeError or, from some
    host-side paths, as ValueError with the runtime's message."""
    import jax

    return isinstance(error, jax.errors.JaxRuntimeError) or any(
        s in str(error) for s in COLLECTIVE_FAILURES)


def stop_process(command: str, error: Exception) -> None:
    """End this process of a multi-process run at once after an error: say what went wrong (a
    failed collective: most likely another process died) and exit with status 1 (2 for a user
    error), skipping JAX's shutdown barrier, which would wait for a dead peer until the heartbeat
    time-out. The other processes then fail their next collective and stop the same way."""
    import traceback

    import jax

    where = f"hgpo-jax {command}: error: process {jax.process_index()} of {jax.process_count()}"
    if is_collective_failure(error):
        print(f"{where}: a collective with the other processes failed, most likely because another "
              f"process died or was killed (see its log); stopping.\n  {type(error).__name__}: "
              f"{str(error)[:500]}", file=sys.stderr, flush=True)
        status = 1
    elif isinstance(error, USER_ERRORS):
        print(f"{where}: {error}", file=sys.stderr, flush=True)
        status = 2
    else:
        traceback.print_exc()
        print(f"{where}: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        status = 1
    sys.stdout.flush()
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
