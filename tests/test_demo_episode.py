"""`hgpo-jax demo --model RUN_DIR --episode`: a run's policy plays one episode of its env with its
agent, each turn printed (observation, raw reply, the agent's `describe` of it), then the totals.

One tiny plan-execute run is made once (module fixture): a one-step supervised warm start of the
tiny random Qwen2 on the toy env (`toy_hiper_format`; an RL run, as in tests/test_hiper.py, takes
~50 s to train here, the SFT step ~10 s, and the demo only needs a run folder with a checkpoint
and a config naming the agent and the env).
"""

import ast
import re

import pytest

from hgpo_jax.agents import get_agent
from hgpo_jax.agents.plan_execute import project
from hgpo_jax.cli import main as cli_main

TURN = re.compile(r"^--- turn (\d+) ---$", re.M)
SUMMARY = re.compile(r"^=== episode: (\d+) turns, reward total (\S+), won (True|False)", re.M)


@pytest.fixture(scope="module")
def hiper_run(tmp_path_factory):
    """A plan-execute run folder on the toy env (one SFT step of the tiny random Qwen2)."""
    run = tmp_path_factory.mktemp("demo") / "run"
    assert cli_main(["sft", "toy_hiper_format", "--no-progress", f"train.run_dir={run}",
                     "model.path=tiny", "sft.episodes=4", "sft.steps=1", "sft.batch_size=8",
                     "train.micro_batch_size=8", "sft.heldout=0", "env.max_steps=6",
                     "rollout.max_new_tokens=24", "rollout.max_prompt_tokens=1280"]) == 0
    return run


def unshown(value: str) -> str:
    """A printed field back to its text (the demo prints "" and odd text as a Python literal)."""
    return ast.literal_eval(value) if value[:1] in ("'", '"') else value


def parse_turns(out: str) -> list[dict[str, str]]:
    """The turn blocks of the demo's output: {"reply": raw reply, field: text, ...} per turn, in
    order (the block's numbers checked)."""
    starts = list(TURN.finditer(out))
    end = SUMMARY.search(out).start()
    turns = []
    for k, m in enumerate(starts):
        assert int(m.group(1)) == k + 1
        block = out[m.end():starts[k + 1].start() if k + 1 < len(starts) else end]
        fields = {}
        for line in block.strip("\n").splitlines():
            if line.startswith("reply: "):
                fields["reply"] = ast.literal_eval(line[len("reply: "):])
            elif line.startswith("  "):
                name, _, value = line.strip().partition(": ")
                fields[name] = unshown(value)
        turns.append(fields)
    return turns


def summary(out: str) -> tuple[int, float, bool]:
    """(turns, reward total, won) of the demo's last block."""
    m = SUMMARY.search(out)
    return int(m.group(1)), float(m.group(2)), m.group(3) == "True"


def assert_plan_execute_turns(turns: list[dict[str, str]]) -> None:
    """Every printed turn's fields are `project`'s of its printed raw reply, in describe's
    order."""
    for turn in turns:
        action, subgoal, switch, valid = project(turn["reply"], "toy")
        assert list(turn)[1:5] == ["action", "valid", "switch", "subgoal"]
        assert (turn["action"], turn["valid"], turn["switch"], turn["subgoal"]) == (
            action, str(valid), switch, subgoal)


def test_demo_episode_prints_each_turns_switch_and_subgoal(hiper_run, capsys):
    assert cli_main(["demo", "--model", str(hiper_run), "--episode", "--task", "0"]) == 0
    out = capsys.readouterr().out
    assert "agent plan-execute, env toy, split valid_seen, task 0 of 60 (100000)" in out
    turns = parse_turns(out)
    length, _, won = summary(out)
    assert 1 <= length <= 6 and len(turns) == length
    assert_plan_execute_turns(turns)
    switches = sum(t["switch"] == "SWITCH" for t in turns)
    starts = sum(1 for i, t in enumerate(turns) if i == 0 or t["switch"] == "SWITCH")
    assert f"  switch turns: {switches}\n  segments: {starts}\n" in out
    assert "task: open the door of the colour of the button you pressed." in out


def plan_reply(switch: str, subgoal: str, action: str) -> str:
    """A plan-execute reply of the three blocks."""
    return f"<switch>{switch}</switch>\n<subgoal>{subgoal}</subgoal>\n<action>{action}</action>"


# task 100000 of the toy env (valid_seen's first): buttons white, black, red; a corridor of 2
SCRIPT = (plan_reply("SWITCH", "press a button", "press white button"),
          plan_reply("SWITCH", "walk to the end", "go forward"),
          plan_reply("KEEP", "walk to the end", "go forward"),
          "<switch>maybe</switch><action>look</action>",
          plan_reply("SWITCH", "open the door", "open white door"))


def test_demo_episode_shows_a_scripted_policys_switches_and_win(hiper_run, capsys, monkeypatch):
    """The sampler replaced by a script of replies (valid SWITCH / KEEP turns, an invalid switch):
    the printed parse, the memory's sub-goal, the reward, the win and the segments."""
    import hgpo_jax.rl.sampling as sampling
    from hgpo_jax.models import load_tokenizer
    from hgpo_jax.runs import model_folder

    tokenizer = load_tokenizer(model_folder(str(hiper_run)))
    replies, prompts = iter(SCRIPT), []

    def scripted(model, batch, max_new_tokens, **kw):
        prompts.append(tokenizer.decode(batch[0]))
        tokens = tokenizer.encode(next(replies))
        return sampling.GenerateOutput([tokens], [[0.0] * len(tokens)], [[0.0] * len(tokens)])

    monkeypatch.setattr(sampling, "generate", scripted)
    assert cli_main(["demo", "--model", str(hiper_run), "--episode"]) == 0
    out = capsys.readouterr().out
    turns = parse_turns(out)
    assert [t["reply"] for t in turns] == list(SCRIPT)
    assert_plan_execute_turns(turns)
    assert [t["switch"] for t in turns] == ["SWITCH", "SWITCH", "KEEP", "", "SWITCH"]
    assert [t["valid"] for t in turns] == ["True", "True", "True", "False", "True"]
    assert summary(out) == (5, 10.0, True)
    assert "  switch turns: 3\n  segments: 3\n" in out  # turns 1, 2 and 5 start a segment
    # each prompt's current sub-goal is the one the previous reply carried (the agent's memory;
    # the invalid turn 4 carried none)
    shown = [re.search(r"Your current sub-goal is:\n(.*)\n", p).group(1) for p in prompts]
    assert shown == ["None", "press a button", "walk to the end", "walk to the end", ""]


def test_watch_episode_plays_what_a_rollout_of_one_env_plays(hiper_run):
    """At temperature 1, `watch_episode` samples the replies `collect_rollouts` samples for the
    same task in a pool of one env (same prompts, rng and row id): the rollout's own step."""
    import functools

    from hgpo_jax.config import load_config
    from hgpo_jax.envs.pool import EnvPool
    from hgpo_jax.envs.registry import get_env
    from hgpo_jax.rl.episodes import watch_episode
    from hgpo_jax.rl.policy import Policy
    from hgpo_jax.rl.rollout import collect_rollouts
    from hgpo_jax.runs import load_model

    cfg = load_config(str(hiper_run))
    spec, agent = get_env("toy"), get_agent("plan-execute", "toy")
    model, tokenizer, _ = load_model(str(hiper_run))
    policy = Policy.of_rollout(model, tokenizer, cfg.rollout, temperature=1.0)
    env_fn = spec.make_env(cfg.env)
    task = spec.list_tasks(cfg.env, "valid_seen")[3]
    episode = watch_episode(policy, env_fn(), task, 4, cfg.env.memory_len, rng=7, spec=spec,
                            agent=agent)
    with EnvPool(functools.partial(env_fn), num_envs=1, num_workers=1) as pool:
        batch = collect_rollouts(policy, pool, [task], 1, 4, cfg.env.memory_len, rng=7, spec=spec,
                                 agent=agent)
    assert [t.reply for t in episode.turns] == [tokenizer.decode(r) for r in batch.response_ids]
    assert [t.prompt_tokens for t in episode.turns] == [len(p) for p in batch.prompt_ids]
    assert [t.parsed.valid for t in episode.turns] == batch.valid.tolist()
    assert [t.reward for t in episode.turns] == batch.reward.tolist()


def test_describe_default_is_the_action_and_validity():
    """An agent without more to show (verl-agent) describes a reply by its action and validity
    only; the demo prints no switch or sub-goal for it and no episode totals."""
    agent = get_agent("verl-agent", "toy")
    assert agent.describe("<think>go</think><action>Go Forward</action>") == {
        "action": "go forward", "valid": "True"}
    assert agent.describe("go forward") == {"action": "go forward", "valid": "False"}
    assert agent.describe_episode(["<action>look</action>"]) == {}
    planner = get_agent("plan-execute", "toy")
    assert planner.describe(SCRIPT[2]) == {"action": "go forward", "valid": "True",
                                           "switch": "KEEP", "subgoal": "walk to the end"}
    assert planner.describe_episode(SCRIPT) == {"switch turns": "3", "segments": "3"}
    assert planner.describe_episode(SCRIPT[2:4]) == {"switch turns": "0", "segments": "1"}


@pytest.mark.parametrize("argv, message", [
    (["--episode"], "--episode plays a run's policy in its env: give --model RUN_DIR"),
    (["--episode", "--model", "{tmp}"], "is not one"),
    (["--episode", "--model", "{run}", "--task", "60"],
     "--task 60: split 'valid_seen' of env 'toy' has 60 tasks; give an index in 0..59"),
    (["--episode", "--model", "{run}", "--task", "-1"], "give an index in 0..59"),
    (["--episode", "--model", "{run}", "--split", "test"],
     "--split 'test': env 'toy' has the splits train, valid_seen, valid_unseen, valid_train"),
    (["--episode", "--model", "{run}", "--max-steps", "0"], "--max-steps 0: give at least 1"),
    (["--episode", "--model", "{run}", "--temperature", "-1"], "--temperature -1.0: give 0"),
    (["--episode", "--model", "{run}", "--prompt", "hi"], "--prompt is the chat demo's"),
    (["--task", "3"], "--task chooses what `demo --episode` plays: add --episode"),
])
def test_demo_episode_errors_before_the_model_loads(argv, message, hiper_run, tmp_path, capsys,
                                                     monkeypatch):
    import hgpo_jax.runs as runs

    def must_not_run(*a, **k):
        raise AssertionError("loaded before the arguments were checked")

    monkeypatch.setattr(runs, "load_model", must_not_run)
    argv = [a.format(tmp=tmp_path, run=hiper_run) for a in argv]
    assert cli_main(["demo", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("hgpo-jax demo: error: ") and message in err[-1], err
