"""ALFWorld on the real TextWorld engine (`textworld` + the `alfworld` package's wrappers).

    from hgpo_jax.envs.alfworld import list_games, AlfworldEnv
    games = list_games("valid_unseen")           # sorted game.tw-pddl paths
    env = AlfworldEnv(max_steps=50)
    obs, info = env.reset(games[0])
    obs, reward, done, info = env.step("go to desk 1")

No game logic is reimplemented: every step goes through TextWorld's PDDL engine with ALFWorld's
`AlfredDemangler` (readable object names) and `AlfredInfos` wrappers. Reward is 10 on success and
0 otherwise; an episode ends on success or after `max_steps` steps. Observations (and anchors) are
the engine's feedback as is, the reset one with its "-= Welcome to TextWorld, ALFRED! =-" banner,
and actions reach the engine unchanged (as the authors' verl-agent runs them): TextWorld itself
strips the command and answers "Nothing happens." to anything not admissible.

Data: `env.data_dir` (the `data_dir` argument), else `$ALFWORLD_DATA`, else the project's copy of the game files
(`../shared/data/alfworld/json_2.1.1.tar.xz` beside the checkout, or `$HGPO_JAX_ALFWORLD_ARCHIVE`),
checked against its sha256 file and unpacked once, atomically, into the cache folder
(`$HGPO_JAX_CACHE`, default `~/.cache/hgpo_jax`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import lru_cache

from hgpo_jax.envs import data
from hgpo_jax.envs.data import cache_root, candidate_archives
from hgpo_jax.envs.episodes import Episode, load_episodes, play_episode, save_episodes, spread
from hgpo_jax.envs.experts import ExpertLog, chosen_tasks, experts_folder, record_missing, won_actions
from hgpo_jax.envs.prompts import task_from_observation

SPLITS = ("train", "valid_seen", "valid_unseen", "valid_train")
# The paper's In-/Out-of-distribution evaluation splits.
EVAL_SPLITS = {"in_distribution": "valid_seen", "out_of_distribution": "valid_unseen"}
TASK_TYPES = ("pick_and_place_simple", "look_at_obj_in_light", "pick_clean_then_place_in_recep",
              "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep",
              "pick_two_obj_and_place")
WIN_REWARD = 10.0
ARCHIVE_NAME = "json_2.1.1.tar.xz"
DATA_FOLDER = "json_2.1.1"

_HOW_TO_GET_DATA = (
    "ALFWorld game files not found. Either set env.data_dir=/path to a folder that "
    f"holds {DATA_FOLDER}/ (or its train/valid_* folders), set $ALFWORLD_DATA, or install the data "
    "with ALFWorld's own downloader: `pip install alfworld && alfworld-download` (it writes "
    f"~/.cache/alfworld; then export ALFWORLD_DATA=~/.cache/alfworld). Looked in: {{looked}}")


class AlfworldDataError(FileNotFoundError):
    """The ALFWorld game files cannot be found or are damaged."""


# --------------------------------------------------------------------------- data location
def _candidate_archives() -> list[str]:
    return candidate_archives("alfworld", ARCHIVE_NAME, os.environ.get("HGPO_JAX_ALFWORLD_ARCHIVE"))


def _splits_folder(path: str) -> str | None:
    """`path` itself or `path/json_2.1.1` if it holds ALFWorld split folders, else None."""
    for folder in (os.path.join(path, DATA_FOLDER), path):
        if any(os.path.isdir(os.path.join(folder, s)) for s in SPLITS):
            return folder
    return None


def unpack_archive(archive: str, dest_root: str) -> str:
    """Unpack the game archive into `dest_root/json_2.1.1` once, atomically (hgpo_jax.envs.data)."""
    return data.unpack_archive(archive, dest_root, DATA_FOLDER, _splits_folder, AlfworldDataError)


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> str:
    """The folder holding ALFWorld's split folders (train/, valid_seen/, ...)."""
    looked = []
    for given in (data_dir, os.environ.get("ALFWORLD_DATA")):
        if given:
            folder = _splits_folder(os.fspath(given))
            if folder:
                return folder
            looked.append(os.fspath(given))
            if given is data_dir:  # an explicit argument that is wrong is an error, not a hint
                raise AlfworldDataError(_HOW_TO_GET_DATA.format(looked=looked))
    cached = os.path.join(cache_root(), "alfworld", DATA_FOLDER)
    if data.is_complete(cached):
        return cached
    for archive in _candidate_archives():
        if os.path.isfile(archive):
            return unpack_archive(archive, os.path.dirname(cached))
        looked.append(archive)
    raise AlfworldDataError(_HOW_TO_GET_DATA.format(looked=looked))


@lru_cache(maxsize=16)
def _list_games_cached(split: str, folder: str) -> tuple[str, ...]:
    root = os.path.join(folder, split)
    games = []
    for dirpath, _, files in os.walk(root):
        if "game.tw-pddl" in files:
            games.append(os.path.join(dirpath, "game.tw-pddl"))
    return tuple(sorted(games))


def list_games(split: str, data_dir: str | os.PathLike | None = None) -> list[str]:
    """Sorted paths of the `game.tw-pddl` files of one split."""
    if split not in SPLITS:
        raise ValueError(f"unknown ALFWorld split {split!r}; use one of {SPLITS}")
    games = list(_list_games_cached(split, resolve_data_dir(data_dir)))
    if not games:
        raise AlfworldDataError(f"no game.tw-pddl files under {resolve_data_dir(data_dir)}/{split}")
    return games


def task_type_of(game_path: str) -> str:
    """Task type from the folder name `TASKTYPE-Object-...-Scene/trial_.../game.tw-pddl`."""
    folder = os.path.basename(os.path.dirname(os.path.dirname(os.path.abspath(game_path))))
    task_type = folder.split("-", 1)[0]
    return task_type if task_type in TASK_TYPES else "unknown"


# --------------------------------------------------------------------------- the environment
def as_command(action) -> str:
    """The text TextWorld is given for `action`: a str unchanged, anything else its str().

    TextWorld strips the command and looks it up among the admissible commands, answering
    "Nothing happens." when it is not one; any str (empty, control characters, 1 MB) is handled
    that way in ~0.1 s. Only objects without `.strip` (None, numbers) make it raise.
    """
    return action if isinstance(action, str) else str(action)


class AlfworldEnv:
    """One ALFWorld game at a time on the TextWorld engine; `reset(game_path)`."""

    def __init__(self, max_steps: int = 50, facts: bool = False):
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.max_steps = max_steps
        self.facts = facts  # also ask the engine for the true facts (state["facts"]; experts only)
        self.state = None  # the engine's last state (a TextWorld GameState)
        self._env = None
        self._game = None
        self.steps = 0
        self.won = False
        self.task = ""

    def reset(self, task: str) -> tuple[str, dict]:
        game = os.fspath(task)
        if not os.path.isfile(game):
            raise FileNotFoundError(f"ALFWorld game file {game!r} does not exist; get paths from "
                                    "list_games(split)")
        if self._env is None:
            self._env = _start(game, facts=self.facts)
            loaded = True
        elif game != self._game:
            self._env.load(game)
            loaded = True
        else:
            loaded = False
        self._game = game
        state = _reset_reusing_loaded_state(self._env) if loaded else self._env.reset()
        self.state = state
        self.steps, self.won = 0, False
        obs = state["feedback"]
        self.task = task_from_observation(obs)
        return obs, self._info(state, obs)

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        if self._env is None:
            raise RuntimeError("call reset(game_path) before step()")
        state, _, _ = self._env.step(as_command(action))
        self.state = state
        self.steps += 1
        obs = state["feedback"]
        newly_won = bool(state["won"]) and not self.won
        self.won = self.won or bool(state["won"])
        done = self.won or self.steps >= self.max_steps
        return obs, WIN_REWARD if newly_won else 0.0, done, self._info(state, obs)

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None

    def _info(self, state, obs: str) -> dict:
        admissible = [a for a in state["admissible_commands"] or [] if a != "help"]
        return {"admissible_actions": admissible, "won": self.won,
                "task_type": task_type_of(self._game), "anchor": obs, "task": self.task,
                "gamefile": self._game, "step": self.steps}


def _start(game: str, facts: bool = False):
    import textworld  # imported lazily: only env workers need the engine
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

    memoize_textworld_parsers()
    translate_replan_lazily()
    infos = textworld.EnvInfos(won=True, admissible_commands=True, facts=facts, extras=["gamefile"])
    return textworld.start(game, request_infos=infos,
                           wrappers=[AlfredDemangler(), AlfredInfos()])


PARSE_CACHE_SIZE = 1 << 16  # parsed strings kept per process (a game uses a few hundred)


def memoize_textworld_parsers() -> None:
    """Make TextWorld parse each grammar or logic string once per process (idempotent).

    At every step TextWorld's PDDL engine writes its feedback and admissible commands from the
    game's text grammar, and re-parses the same template and query strings with tatsu each time
    (`textworld.envs.pddl.textgen._parse_and_convert`, `textworld.logic._parse_and_convert`):
    about 70% of a step. A parse is a pure function of its string, so its result is kept (LRU,
    PARSE_CACHE_SIZE strings) and a deep copy is returned each call (the engine sets contexts on
    the symbols it gets). Steps are ~3.5x faster; every observation, admissible list and reward
    is unchanged (tests/test_alfworld.py plays the same games both ways).
    """
    import textworld.logic as logic
    from textworld.envs.pddl import textgen

    for module in (textgen, logic):
        parse = module._parse_and_convert
        if getattr(parse, "memoized", False):
            continue
        module._parse_and_convert = _memoized(parse)


def _memoized(parse):
    import copy

    @lru_cache(maxsize=PARSE_CACHE_SIZE)
    def parsed(args: tuple, kwargs: tuple):
        return parse(*args, **dict(kwargs))

    def cached_parse(*args, **kwargs):
        return copy.deepcopy(parsed(args, tuple(sorted(kwargs.items()))))

    cached_parse.memoized = True
    cached_parse.original = parse
    return cached_parse


def translate_replan_lazily() -> None:
    """Make TextWorld translate a game's PDDL problem once per game state instead of twice
    (idempotent, for this process).

    TextWorld's `PddlState` runs Fast Downward's translator twice on the same problem: once for
    the game and once, optimized, for its planner (`replan`: the `policy_commands` info and the
    walkthrough extra), ~0.18 s each. The env never asks for either, so
    the planner's slot is given the game's own translation, and `replan`, if ever called,
    translates the optimized problem first and loads it (the same plans as TextWorld's, also
    mid-episode). Every observation, admissible list and reward is unchanged
    (tests/test_alfworld.py plays the same games both ways and compares replans).
    """
    import fast_downward
    from textworld.envs.pddl import logic as pddl_logic

    if getattr(pddl_logic.fast_downward.pddl2sas, "replan_lazily", False):
        return
    last: list = [None, None]  # ((domain, problem), its plain translation)

    def pddl2sas(domain: str, problem: str, verbose: bool = False, optimize: bool = False):
        if optimize and last[0] is not None and last[0] == (domain, problem):
            return last[1]  # the planner's slot, right after the game's own translation
        out = pddl2sas.original(domain, problem, verbose=verbose, optimize=optimize)
        if not optimize:
            last[:] = [(domain, problem), out]
        return out

    replan = pddl_logic.PddlState.replan

    def exact_replan(state, infos):
        if not getattr(state, "_replan_translated", False):
            _, sas = pddl2sas.original(state._logic.domain, state.pddl_problem, optimize=True)
            state.downward_lib.load_sas_replan(sas.encode("utf-8"))
            state._replan_translated = True
        return replan(state, infos)

    pddl2sas.replan_lazily = True
    pddl2sas.original = fast_downward.pddl2sas
    exact_replan.original = replan
    pddl_logic.fast_downward.pddl2sas = pddl2sas
    pddl_logic.PddlState.replan = exact_replan


def _reset_reusing_loaded_state(env):
    """`env.reset()` right after `env.load(game)`, without building the game's PDDL state twice.

    TextWorld's PddlEnv builds the initial state (a Fast Downward translation of the game's PDDL
    problem, about 40% of a reset) in `load` and again, from the same problem and logic, in
    `reset`; the second one is the same initial state. Here `reset` is handed the state `load`
    built (nothing has stepped it). Every observation, admissible list and reward is unchanged
    (tests/test_alfworld.py replays walkthroughs both ways).
    """
    from textworld.envs.pddl import pddl as pddl_env

    inner = env
    while inner.__dict__.get("_wrapped_env") is not None:
        inner = inner.__dict__["_wrapped_env"]
    loaded = inner.__dict__.get("_pddl_state")
    if loaded is None:
        return env.reset()
    build = pddl_env.pddl_logic.PddlState
    pddl_env.pddl_logic.PddlState = lambda *args, **kwargs: loaded
    try:
        return env.reset()
    finally:
        pddl_env.pddl_logic.PddlState = build


def walkthrough(game_path: str) -> list[str]:
    """The expert action sequence stored in a game file."""
    import json

    with open(game_path, encoding="utf-8") as f:
        return list(json.load(f)["walkthrough"])


def task_params(game_path: str) -> dict[str, str]:
    """The task's PDDL parameters, read from its folder name `TASKTYPE-Object-MovableRecep-Recep-Scene`
    (the release's traj_data.json, where ALFWorld's hand-coded expert reads them, is not in the
    project's data): task_type, object_target, mrecep_target ("" for None), parent_target and
    toggle_target (both the Recep part: the lamp of look_at_obj_in_light tasks)."""
    folder = os.path.basename(os.path.dirname(os.path.dirname(os.path.abspath(game_path))))
    parts = folder.split("-")
    if len(parts) != 5 or parts[0] not in TASK_TYPES:
        raise ValueError(f"{game_path!r} is not in a TASKTYPE-Object-MovableRecep-Recep-Scene "
                         "folder of the ALFWorld release; its task parameters are unknown")
    task_type, obj, mrecep, recep, _ = parts
    return {"task_type": task_type, "object_target": obj, "parent_target": recep,
            "toggle_target": recep, "mrecep_target": "" if mrecep == "None" else mrecep}


class SearchExpert:
    """ALFWorld's hand-coded expert (`alfworld.agents.expert.HandCodedTWAgent`, the teacher of the
    ALFWorld paper's DAgger agents) for one game: unlike the stored walkthrough, which goes
    straight to where the hidden objects are, it finds objects by visiting receptacles in the
    order of its object-to-receptacle priors, opening closed ones (and closing them after), so
    its episodes show search and recovery. It reads the engine's true facts (AlfworldEnv(facts=True))
    only to know what it holds and whether that is hot, cool or clean.

        env = AlfworldEnv(facts=True); obs, info = env.reset(game)
        expert = SearchExpert(game, obs, seed=0)
        action = expert.act(env.state, info["admissible_actions"], last_action="")

    Its random choices (which of several visible targets; a random admissible action when it
    would repeat itself) draw from its own `random.Random(seed)`: the library's module-level
    `random` is swapped for it during each call and restored after.
    """

    def __init__(self, game_path: str, first_observation: str, seed: int = 0, max_steps: int = 200):
        import random

        import alfworld.gen.constants as constants
        from alfworld.agents.expert import HandCodedTWAgent

        params = {k: (v.lower() if v in constants.OBJECTS else v)
                  for k, v in task_params(game_path).items()}
        self._agent = HandCodedTWAgent(max_steps=max_steps)
        self._agent.task_params = params
        self._agent.policy = self._agent.get_task_policy(params)(params, max_steps=max_steps)
        self._rng = random.Random(seed)
        self._call(self._agent.observe, first_observation)

    def _call(self, fn, *args):
        from alfworld.agents.expert import handcoded_expert

        module_random = handcoded_expert.random
        handcoded_expert.random = self._rng
        try:
            return fn(*args)
        finally:
            handcoded_expert.random = module_random

    def act(self, state, admissible: list[str], last_action: str) -> str:
        """The next action given the engine's state (with facts) after `last_action` ("" at the
        first step). "look" when the expert's choice is not admissible (as ALFWorld's wrapper)."""
        view = dict(state)
        view["admissible_commands"] = list(admissible)
        action = self._call(self._agent.act, view, 0, bool(state["won"]), last_action)
        return action if action in admissible else "look"


# --------------------------------------------------------------------------- registry entry
def _make_env(env_cfg):
    import functools

    return functools.partial(AlfworldEnv, max_steps=env_cfg.max_steps)


def _list_tasks(env_cfg, split: str) -> list[str]:
    return list_games(split, env_cfg.data_dir)


# --------------------------------------------------------------------------- recorded episodes
ALFWORLD_KINDS = ("expert", "search")


def alfworld_episodes(games: Sequence[str], *, kind: str = "expert", seed: int = 0, max_steps: int = 50,
                      first_index: int = 0, progress: bool = False) -> list[Episode]:
    """Winning episodes of `games` played through the real ALFWorld engine (every step gets its
    real observation and admissible actions): kind "expert" replays each game's stored
    walkthrough (straight to the hidden objects), kind "search" plays ALFWorld's hand-coded
    expert (`envs.alfworld.SearchExpert`: it looks for the objects receptacle by receptacle;
    its random choices seeded by `seed` and the game's index, counted from `first_index`, so a
    list recorded in slices equals the list recorded at once). Games not won within
    `max_steps` are dropped (with a warning for walkthroughs, which should always win)."""
    import warnings

    from tqdm.auto import tqdm

    if kind not in ALFWORLD_KINDS:
        raise ValueError(f"unknown ALFWorld episode kind {kind!r}; use one of {ALFWORLD_KINDS}")
    env = AlfworldEnv(max_steps=max_steps, facts=kind == "search")
    out = []
    try:
        for i, game in enumerate(tqdm(games, desc=f"{kind} episodes", unit="game", disable=not progress)):
            if kind == "expert":
                plan = walkthrough(game)
                ep = play_episode(env, game, lambda obs, info, t, plan=plan: plan[t],
                                  min(max_steps, len(plan)), source=f"alfworld:{game}")
                if not ep.won:
                    warnings.warn(f"the walkthrough of {game} did not win in {max_steps} steps; skipped")
            else:
                ep = _search_episode(env, game, seed * 1_000_003 + first_index + i, max_steps)
            if ep is not None and ep.won:
                out.append(ep)
    finally:
        env.close()
    return out


def _search_episode(env, game: str, seed: int, max_steps: int) -> Episode | None:
    """One episode of the hand-coded expert on `game`; None when the expert gives up."""
    from alfworld.agents.expert import HandCodedAgentFailed, HandCodedAgentTimeout

    expert, last = None, ""

    def choose(obs, info, t):
        nonlocal expert, last
        if t == 0:
            expert = SearchExpert(game, obs, seed=seed)
        last = expert.act(env.state, info["admissible_actions"], last)
        return last

    try:
        return play_episode(env, game, choose, max_steps, source=f"alfworld-search:{game}")
    except (HandCodedAgentFailed, HandCodedAgentTimeout):
        return None


def cached_alfworld_episodes(split: str, num_games: int, data_dir: str | None = None,
                             progress: bool = False, kind: str = "expert") -> list[Episode]:
    """Winning episodes (see alfworld_episodes) of `num_games` games spread over a split (sorted
    paths, so every task type is covered), played once and cached as JSON lines under
    $HGPO_JAX_CACHE/expert/ (alfworld-SPLIT-N.jsonl; alfworld-SPLIT-search-N.jsonl for "search")."""
    path = alfworld_episodes_path(split, num_games, kind)
    if os.path.isfile(path):
        return load_episodes(path)
    episodes = alfworld_episodes(spread(list_games(split, data_dir), num_games), kind=kind,
                                 progress=progress)
    save_episodes(episodes, path)
    return episodes


def alfworld_episodes_path(split: str, num_games: int, kind: str = "expert") -> str:
    """Where cached_alfworld_episodes keeps (or finds) its episodes."""
    name = f"alfworld-{split}-{num_games}" if kind == "expert" else f"alfworld-{split}-{kind}-{num_games}"
    return os.path.join(cache_root(), "expert", f"{name}.jsonl")


def _record_episodes(env_cfg, split: str, n: int, kind: str, *, seed: int = 0,
                     progress: bool = False) -> list:
    if kind not in ALFWORLD_KINDS:
        raise ValueError(f"sft.data kind {kind!r} is not recorded for ALFWorld; use 'expert' (the "
                         "games' walkthroughs) or 'search' (ALFWorld's hand-coded expert, which "
                         "searches receptacles), e.g. sft.data=expert+search:800")
    return cached_alfworld_episodes(split, n, env_cfg.data_dir, progress=progress, kind=kind)


# --------------------------------------------------------------------------- expert trajectories
# The hand-coded expert's actions per game, for expert-guided rollouts (hgpo_jax.envs.experts).
# Raise EXPERT_RECORDER_VERSION whenever a change could alter what is recorded (the expert, its
# seeding, the engine wrappers): the log's name holds it, so older recordings are not reused.
EXPERT_RECORDER_VERSION = 3  # 2: "look" dropped, walkthrough fallback; 3: at most 15 steps
EXPERT_SEED = 0  # SearchExpert's seed on every game (what alfworld_episodes gives a game alone)
EXPERT_MAX_STEPS = 50  # the expert's step budget while recording (seed 0 has won in up to 27)
EXPERT_MAX_LENGTH = 15  # the longest expert kept (the authors' longest); else the walkthrough


def expert_log_path() -> str:
    """The log of the hand-coded expert's games: one for all splits (a game is keyed by its
    trial folder, unique over the release, and its file's sha256)."""
    name = f"search-seed{EXPERT_SEED}-steps{EXPERT_MAX_STEPS}-r{EXPERT_RECORDER_VERSION}.jsonl"
    return os.path.join(experts_folder("alfworld"), name)


def trial_of(game_path: str) -> str:
    """The game's trial folder name (`trial_T...`, the folder holding its game.tw-pddl)."""
    return os.path.basename(os.path.dirname(os.path.abspath(game_path)))


def expert_key(game_path: str) -> str:
    """A game's key in the expert log: `trial_T...@<sha256 of the game file, 16 hex>`, so a game
    file whose content changed (another data release) is recorded again."""
    import hashlib

    with open(game_path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    return f"{trial_of(game_path)}@{digest[:16]}"


def _play_search_expert(env: AlfworldEnv, game: str) -> dict:
    """The log record of the expert on `game`: the hand-coded expert (seed EXPERT_SEED) without
    its "look" steps, which it sends when its choice is not admissible and which change nothing
    in the game (the authors' trajectories have none); where it does not win within
    EXPERT_MAX_STEPS, or takes more than EXPERT_MAX_LENGTH steps (the authors' longest), the
    game's stored walkthrough, played to check that it wins (the authors' file holds walkthroughs
    too, and every train game has an expert of 3-15 steps there). Measured on 30 train games
    spread over the split: the hand-coded expert without "look" took 4-39 steps (mean 12.7)."""
    episode = _search_episode(env, game, EXPERT_SEED, EXPERT_MAX_STEPS)
    actions = [] if episode is None or not episode.won else \
        [s.action for s in episode.steps if s.action != "look"]
    if 0 < len(actions) <= EXPERT_MAX_LENGTH:
        source = "search"
    else:
        plan = walkthrough(game)
        played = play_episode(env, game, lambda obs, info, t: plan[t],
                              min(EXPERT_MAX_STEPS, len(plan)))
        actions, source = (plan if played.won else []), "walkthrough"
    return {"won": bool(actions), "actions": actions, "source": source,
            "trial": trial_of(game), "task_type": task_type_of(game)}


def search_expert_actions(games: Sequence[str], *, workers: int = 1,
                          progress: bool = False) -> dict[str, tuple[str, ...]]:
    """{game path: the hand-coded expert's actions} for the games of `games` it wins, played
    through the engine once and kept in the log (expert_log_path); games already there are read
    back, the others played (by `workers` processes), each written as soon as it ends."""
    import functools

    jobs = {expert_key(game): game for game in games}
    records = record_missing(
        ExpertLog(expert_log_path()), jobs, _play_search_expert,
        functools.partial(AlfworldEnv, max_steps=EXPERT_MAX_STEPS, facts=True),
        workers=workers, progress=progress, desc="alfworld experts")
    return won_actions(records, jobs)


def _expert_trajectories(env_cfg, split: str, *, progress: bool = False, workers: int = 1,
                         tasks: Sequence[str] | None = None) -> dict[str, tuple[str, ...]]:
    """The registry's expert_trajectories: the hand-coded expert (kind "search") on the split's
    games, keyed by game path (the env's task ids)."""
    games = chosen_tasks(list_games(split, env_cfg.data_dir), tasks, "alfworld", split)
    return search_expert_actions(games, workers=workers, progress=progress)


def _env_specs() -> dict:
    from hgpo_jax.envs.registry import BuiltModel, EnvSpec

    return {"alfworld": EnvSpec(
        name="alfworld", make_env=_make_env, list_tasks=_list_tasks, splits=SPLITS,
        eval_splits=tuple(EVAL_SPLITS.values()), record_episodes=_record_episodes,
        episode_kinds=ALFWORLD_KINDS, expert_trajectories=_expert_trajectories,
        whole_expert_guidance=True, built_model=BuiltModel(vocab=4096))}


ENV_SPECS = _env_specs()
