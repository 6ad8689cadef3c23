"""`hgpo-jax demo`: a reply to a chat prompt decoded by a checkpoint (a HF folder, a run's latest
policy or a tiny random model), with timings; or (`--episode`) a run's latest policy playing one
episode of its env with its agent, each turn printed as it is played."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import TYPE_CHECKING

from hgpo_jax.commands.common import show_progress

if TYPE_CHECKING:
    from hgpo_jax.config import Config
    from hgpo_jax.envs.registry import EnvSpec

DEMO_NEW_TOKENS = 32  # the chat demo's reply length
DEFAULT_PROMPT = ("Your task is to: put a clean mug in coffeemachine. You are in the middle of a "
                  "room. What do you do next?")


def check_demo_model(path: str) -> None:
    """`demo --model PATH`: a Hugging Face folder (config.json), an hgpo-jax run folder, or a
    model built on first use as every command takes them (tiny, build:<env>-<size>[/<family>])."""
    from hgpo_jax.build import is_built_on_use
    from hgpo_jax.runs import is_run_dir

    if is_built_on_use(path):
        return
    if not os.path.exists(path):
        raise FileNotFoundError(f"--model {path}: the folder does not exist (give a Hugging Face "
                                "model folder, a run folder, tiny or build:<env>-<size>[/<family>])")
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
    (`hgpo_jax.rl.episodes.watch_episode`), each turn printed as it is played."""
    from hgpo_jax.agents import get_agent
    from hgpo_jax.rl.episodes import watch_episode
    from hgpo_jax.rl.policy import Policy
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
