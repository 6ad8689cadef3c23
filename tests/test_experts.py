"""Expert trajectories per env (EnvSpec.expert_trajectories, hgpo_jax.envs.experts): what each
env's expert does, that its actions win when replayed as is, and the on-disk log (cache round
trip, resuming an interrupted recording, worker processes, stale recordings)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from hgpo_jax.config import EnvConfig
from hgpo_jax.envs import alfworld
from hgpo_jax.envs.experts import ExpertLog, chosen_tasks, record_missing, won_actions
from hgpo_jax.envs.registry import EnvSpec, get_env


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    """An empty cache folder for the test (env data is found before it moves: pass data_dir)."""
    monkeypatch.setenv("HGPO_JAX_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


# ------------------------------------------------------------------------------------ the log
def test_log_skips_a_torn_line_and_keeps_the_last_line_of_a_key(tmp_path):
    log = ExpertLog(str(tmp_path / "sub" / "log.jsonl"))
    assert log.read() == {}
    log.append("a", {"won": True, "actions": ["x"]})
    with open(log.path, "a", encoding="utf-8") as f:
        f.write('{"key": "b", "won": tr')  # a write cut by a kill
    assert log.read() == {"a": {"won": True, "actions": ["x"]}}
    log.append("b", {"won": False, "actions": []})
    log.append("a", {"won": True, "actions": ["y"]})
    assert log.read() == {"a": {"won": True, "actions": ["y"]}, "b": {"won": False, "actions": []}}
    with open(log.path, encoding="utf-8") as f:
        assert len(f.read().splitlines()) == 4  # the torn line stayed a line of its own


def _fake_play(env, job: int) -> dict:
    """A module-level play function (worker processes import it): wins the even jobs."""
    return {"won": job % 2 == 0, "actions": [f"{env} {job}"]}


def test_record_missing_plays_only_what_the_log_lacks_in_workers_too(tmp_path):
    log = ExpertLog(str(tmp_path / "log.jsonl"))
    jobs = {f"k{i}": i for i in range(4)}
    played = []

    def play(env, job):
        played.append(job)
        return _fake_play(env, job)

    first = record_missing(log, {k: jobs[k] for k in ("k0", "k1")}, play, lambda: "env")
    assert played == [0, 1] and first["k1"] == {"won": False, "actions": ["env 1"]}
    records = record_missing(log, jobs, play, lambda: "env")
    assert played == [0, 1, 2, 3] and set(records) == set(jobs)
    assert won_actions(records, jobs) == {0: ("env 0",), 2: ("env 2",)}

    other = ExpertLog(str(tmp_path / "workers.jsonl"))
    records = record_missing(other, jobs, _fake_play, str, workers=2)  # env: str() -> ""
    assert won_actions(records, jobs) == {0: (" 0",), 2: (" 2",)}
    assert set(other.read()) == set(jobs)
    with pytest.raises(ValueError, match="workers"):
        record_missing(log, jobs, play, str, workers=0)


def test_chosen_tasks_must_be_tasks_of_the_split():
    assert chosen_tasks([1, 2, 3], None, "toy", "train") == [1, 2, 3]
    assert chosen_tasks([1, 2, 3], [3, 1], "toy", "train") == [3, 1]
    with pytest.raises(ValueError, match="toy: 1 task.*not in split 'train'.*list_tasks"):
        chosen_tasks([1, 2, 3], [4], "toy", "train")


def test_envs_declare_their_experts():
    for name in ("alfworld", "webshop", "toy", "toy-history"):
        assert callable(get_env(name).expert_trajectories), name
    bare = EnvSpec(name="x", make_env=None, list_tasks=None, splits=(), eval_splits=())
    assert bare.expert_trajectories is None


# ------------------------------------------------------------------------------------ toy
@pytest.mark.parametrize("name", ["toy", "toy-history"])
def test_toy_experts_win_when_replayed(name):
    from hgpo_jax.envs.toy import ToyMemoryEnv, env_kwargs

    spec, cfg = get_env(name), EnvConfig(name=name)
    experts = spec.expert_trajectories(cfg, "valid_seen", progress=True, workers=2)
    assert list(experts) == spec.list_tasks(cfg, "valid_seen")  # every task has one
    env = ToyMemoryEnv(**env_kwargs(name))
    for task in list(experts)[:12]:
        env.reset(task)
        for action in experts[task]:
            obs, reward, done, info = env.step(action)
        assert done and info["won"] and reward == 10.0
    assert set(spec.expert_trajectories(cfg, "train", tasks=[5, 7])) == {5, 7}
    with pytest.raises(ValueError, match="unknown toy split 'test'"):
        spec.expert_trajectories(cfg, "test")


# ------------------------------------------------------------------------------------ webshop
@pytest.fixture(scope="module")
def webshop_cfg():
    from hgpo_jax.envs.webshop.data import resolve_data_dir

    return EnvConfig(name="webshop", data_dir=resolve_data_dir())


def test_webshop_target_key():
    from hgpo_jax.envs.webshop.expert import webshop_target_key

    goal = {"asin": "b07abc1234", "goal_options": {"color": "Black ", "size": "X  Large",
                                                  "style": "black"}}
    assert webshop_target_key(goal) == "B07ABC1234::black#2|x large#1"
    assert webshop_target_key({"asin": "B0X", "goal_options": {}}) == "B0X::"


def test_webshop_experts_are_direct_purchases_that_win(webshop_cfg, cache, monkeypatch):
    import hgpo_jax.envs.webshop as webshop
    from hgpo_jax.envs.webshop import WebShopEnv, train_reward
    from hgpo_jax.envs.webshop.expert import title_actions

    spec = get_env("webshop")
    tasks = list(range(500, 508))
    experts = spec.expert_trajectories(webshop_cfg, "train", tasks=tasks)
    assert 500 not in experts and len(experts) >= 5  # goal 500 cannot score 1 (test_webshop_env)
    env = WebShopEnv(seed=0, data_dir=webshop_cfg.data_dir)
    for task, actions in experts.items():
        goal = env.engine.goal(0, task)
        options = [f"click[{v}]" for v in goal["goal_options"].values()]
        # the authors' shape: search, the item, each option, buy now; SFT's shopper adds a detour
        assert actions[0].startswith("search[") and actions[1] == f"click[{goal['asin'].lower()}]"
        assert list(actions[2:-1]) == options and actions[-1] == "click[buy now]"
        assert len(actions) == 3 + len(goal["goal_options"])
        assert title_actions(goal, env.engine.by_asin[goal["asin"]]) == \
            [*actions[:-1], "click[description]", "click[< prev]", actions[-1]]
        env.reset(task)
        for action in actions:
            obs, reward, done, info = env.step(action)
        assert done and info["won"] and train_reward(reward, info) == 10.0

    # read back from the log: nothing is played again
    monkeypatch.setattr(webshop, "_play_purchase", _must_not_play)
    assert spec.expert_trajectories(webshop_cfg, "train", tasks=tasks) == experts
    with pytest.raises(ValueError, match="not in split 'test'"):
        spec.expert_trajectories(webshop_cfg, "test", tasks=[600])
    with pytest.raises(ValueError, match="unknown WebShop split"):
        spec.expert_trajectories(webshop_cfg, "valid")


def test_webshop_log_is_keyed_by_seed_data_and_version(webshop_cfg, monkeypatch):
    import hgpo_jax.envs.webshop as webshop

    folder = webshop_cfg.data_dir
    path = webshop.expert_log_path(0, folder)
    assert path != webshop.expert_log_path(1, folder)
    monkeypatch.setattr(webshop, "EXPERT_RECORDER_VERSION", webshop.EXPERT_RECORDER_VERSION + 1)
    assert webshop.expert_log_path(0, folder) != path


def test_webshop_missing_data_says_how_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="WebShop data"):
        get_env("webshop").expert_trajectories(EnvConfig(name="webshop", data_dir=str(tmp_path)),
                                               "train")


# ------------------------------------------------------------------------------------ alfworld
# The first is the list the design notes quote from the authors' file (agent-g2.md 5.2).
TOILETPAPER = ("go to toiletpaperhanger 1", "go to toilet 1", "take toiletpaper 1 from toilet 1",
               "go to toiletpaperhanger 1", "move toiletpaper 1 to toiletpaperhanger 1")
ALFWORLD_TRIALS = ("ToiletPaperHanger-406/trial_T20190908_122807_136741",
                   "Laptop-None-ArmChair-205/trial_T20190908_082607_110365",
                   "Statue-None-Dresser-319/trial_T20190909_122754_357020")


@pytest.fixture(scope="module")
def alfworld_cfg():
    return EnvConfig(name="alfworld", data_dir=alfworld.resolve_data_dir())


@pytest.fixture(scope="module")
def alfworld_games(alfworld_cfg):
    games = alfworld.list_games("train", alfworld_cfg.data_dir)
    return [next(g for g in games if trial in g) for trial in ALFWORLD_TRIALS]


def _must_not_play(*args, **kwargs):
    raise AssertionError("played an expert episode that the log holds")


def test_alfworld_experts_resume_are_cached_and_win(alfworld_cfg, alfworld_games, cache,
                                                    monkeypatch):
    spec, games = get_env("alfworld"), alfworld_games
    real_play, played = alfworld._play_search_expert, []

    def play_then_stop(env, game):
        if len(played) == 2:
            raise KeyboardInterrupt  # the recording is stopped during its third game
        played.append(game)
        return real_play(env, game)

    monkeypatch.setattr(alfworld, "_play_search_expert", play_then_stop)
    with pytest.raises(KeyboardInterrupt):
        spec.expert_trajectories(alfworld_cfg, "train", tasks=games)
    assert played == games[:2]
    lines = ExpertLog(alfworld.expert_log_path()).read()
    assert sorted(r["trial"] for r in lines.values()) == sorted(g.split("/")[-2] for g in games[:2])
    assert os.path.dirname(alfworld.expert_log_path()) == str(cache / "alfworld" / "experts")

    # resumed: only the game the log lacks is played
    played.clear()
    monkeypatch.setattr(alfworld, "_play_search_expert",
                        lambda env, game: (played.append(game), real_play(env, game))[1])
    experts = spec.expert_trajectories(alfworld_cfg, "train", tasks=games)
    assert played == games[2:]
    assert list(experts) == games and set(games) <= set(spec.list_tasks(alfworld_cfg, "train"))
    assert experts[games[0]] == TOILETPAPER  # seed 0 reproduces the authors' list here

    # read back: no expert played, no engine started
    monkeypatch.setattr(alfworld, "_play_search_expert", _must_not_play)
    monkeypatch.setattr(alfworld, "AlfworldEnv", _must_not_play)
    assert spec.expert_trajectories(alfworld_cfg, "train", tasks=games) == experts
    monkeypatch.undo()

    # the actions, replayed as is in a fresh env, win (the episode ends on the last one)
    env = alfworld.AlfworldEnv(max_steps=50)
    for game, actions in experts.items():
        env.reset(game)
        rewards = [env.step(action)[1:3] for action in actions]
        assert rewards[-1] == (10.0, True) and not any(done for _, done in rewards[:-1])
    env.close()


def test_alfworld_log_key_follows_the_game_file(alfworld_games, tmp_path, monkeypatch):
    game = alfworld_games[0]
    copy = tmp_path / "pick-x" / "trial_T1" / "game.tw-pddl"
    copy.parent.mkdir(parents=True)
    shutil.copy(game, copy)
    digest = alfworld.expert_key(game).split("@")[1]
    assert alfworld.expert_key(str(copy)) == f"trial_T1@{digest}"  # the trial folder, the content
    data = json.loads(copy.read_text())
    data["walkthrough"] = data["walkthrough"][:1]  # another release of the game
    copy.write_text(json.dumps(data))
    trial, changed = alfworld.expert_key(str(copy)).split("@")
    assert trial == "trial_T1" and changed != digest  # recorded afresh
    path = alfworld.expert_log_path()
    monkeypatch.setattr(alfworld, "EXPERT_RECORDER_VERSION", alfworld.EXPERT_RECORDER_VERSION + 1)
    assert alfworld.expert_log_path() != path


def test_alfworld_errors_name_the_fix(alfworld_cfg, alfworld_games, tmp_path):
    spec = get_env("alfworld")
    with pytest.raises(FileNotFoundError, match="ALFWorld game files not found.*alfworld-download"):
        spec.expert_trajectories(EnvConfig(name="alfworld", data_dir=str(tmp_path)), "train")
    with pytest.raises(ValueError, match="alfworld: 1 task.*not in split 'valid_seen'"):
        spec.expert_trajectories(alfworld_cfg, "valid_seen", tasks=alfworld_games[:1])
    with pytest.raises(ValueError, match="unknown ALFWorld split"):
        spec.expert_trajectories(alfworld_cfg, "test")


# ------------------------------------------------------------------------------------ the script
def test_record_experts_script_prints_the_lengths(capsys):
    from experiments import record_experts as script

    script.main(["--env", "toy", "--split", "train", "--limit", "6"])
    out = capsys.readouterr().out
    assert "toy train: 6 of 6 tasks have an expert" in out and "histogram 3:2 4:2 5:2" in out
    assert script.length_histogram({}) == "no experts"
