"""Search-QA texts and data (`hgpo_jax.envs.search.text`, `hgpo_jax.envs.search.data`): the authors'
observations and EM reward on random cases, and the readers of passages and questions.

The fixture tests/data/search_env_reference.json holds inputs and the outputs of the authors' code
(verl-agent's search env at 20bd331, in the fork zzj1111/alfworldauto: SkyRL-gym's `SearchEnv`, its
search tool's formatting, their batch env and projection, their EM utilities), produced outside the
repository with

    python tests/data/search_env_reference.py <exported verl-agent tree> \
        tests/data/search_env_reference.json

(Python 3.11; the script's docstring says what it drives and how). Every case must be equal.
"""

import json
import os
import pathlib
import tarfile

import pytest

from hgpo_jax.envs import data as env_data
from hgpo_jax.envs.search import data
from hgpo_jax.envs.search.data import (
    Passage,
    Question,
    SearchDataError,
    default_files,
    read_corpus,
    read_questions,
    resolve_data_dir,
)
from hgpo_jax.envs.search.text import (
    contents_text,
    exact_match,
    extract_answer,
    history_text,
    information_text,
    normalized_answer,
    prepare_question,
    search_error_text,
)

FIXTURE = json.loads((pathlib.Path(__file__).parent / "data" / "search_env_reference.json")
                     .read_text())


# ------------------------------------------------------------------------ the authors' outputs
def test_fixture_source():
    assert FIXTURE["source"]["commit"].startswith("20bd331")
    assert len(FIXTURE["passages"]) >= 100 and len(FIXTURE["episodes"]) >= 200


def test_observation_after_a_search_is_theirs():
    for passages, observation in FIXTURE["passages"]:
        assert information_text([tuple(p) for p in passages]) == observation, passages
    for contents, observation in FIXTURE["contents"]:
        assert contents_text(contents) == observation, contents


def test_observation_after_a_failed_search_is_theirs():
    for message, observation in FIXTURE["errors"]:
        assert search_error_text(message) == observation, message


def test_episode_history_and_reward_are_theirs():
    for case in FIXTURE["episodes"]:
        actions = [step[0] for step in case["steps"]]
        observations = [step[1] for step in case["steps"]]
        history = history_text(actions, observations)
        assert history == case["history"], case
        assert history_text(actions, observations[:-1]) == history  # the final "" may be left out
        *middle, last = case["steps"]
        assert all(step[2] == 0.0 and not step[3] for step in middle)
        assert last[3] and exact_match(history, case["golds"]) == last[2], case
        assert last[4] == (last[2] >= 1.0)


def test_normalize_extract_score_are_theirs():
    for s, expected in FIXTURE["normalize"]:
        assert normalized_answer(s) == expected, s
    for s, expected in FIXTURE["extract"]:
        assert extract_answer(s) == expected, s
    for s, golds, expected in FIXTURE["score"]:
        assert exact_match(s, golds) == expected, (s, golds)


# --------------------------------------------------------------------------------- text, by hand
def test_information_text_format():
    obs = information_text([("Ann \"A\" Smith", "Born 1900.\nDied é."), ("B", "")])
    assert obs == (r'<information>{"result": "Doc 1: \"Ann \"A\" Smith\"\nBorn 1900.\nDied \u00e9.'
                   r'\nDoc 2: \"B\"\n"}</information>')
    assert information_text([]) == '<information>{"result": ""}</information>'
    assert search_error_text("x") == '<information>{"result": "Search error: x"}</information>'


def test_exact_match_rules():
    assert exact_match("<answer> The  Beatles. </answer>", ["beatles"]) == 1.0
    assert exact_match("<answer>Paris</answer> then <answer>Lyon</answer>", ["Paris"]) == 0.0
    assert exact_match("<answer>Paris</answer>", "paris") == 1.0  # one string, one answer
    assert exact_match("no answer", ["x"]) == 0.0
    assert exact_match("<answer></answer>", ["*"]) == 1.0  # a gold that normalises to ""
    assert extract_answer("<answer>a\nb</answer>") == "a\nb"
    assert extract_answer("<Answer>x</Answer>") is None
    assert history_text(["<search>q</search>", "<answer>a</answer>"],
                        ["<information>i</information>"]) \
        == "<search>q</search>\n<information>i</information>\n<answer>a</answer>"
    with pytest.raises(ValueError, match="observations"):
        history_text(["a"], ["b", "c"])


def test_prepare_question():
    assert prepare_question("  who wrote it ") == "who wrote it?"
    assert prepare_question("Who wrote it?\n") == "Who wrote it?"
    assert prepare_question(prepare_question("x")) == "x?"
    assert prepare_question("is it 'x'.") == "is it 'x'.?"
    with pytest.raises(ValueError, match="empty"):
        prepare_question(" \n")


# ------------------------------------------------------------------------------------ corpus
def write_lines(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows),
                    encoding="utf-8")
    return str(path)


def test_load_corpus_both_formats(tmp_path):
    path = write_lines(tmp_path / "c.jsonl", [
        {"id": "1", "title": "A", "text": "alpha"},
        "",
        {"id": 2, "contents": '"B "quoted""\nline one\nline two  '},
        {"id": "3", "contents": '"C"'},
        {"id": "4", "title": "D", "text": "", "extra": 1},
    ])
    passages = read_corpus(path)
    assert passages == [Passage("1", "A", "alpha"),
                        Passage("2", 'B "quoted"', "line one\nline two  "),
                        Passage("3", "C", ""), Passage("4", "D", "")]
    assert passages[1].contents == '"B "quoted""\nline one\nline two  '
    assert information_text([(p.title, p.text) for p in passages]) \
        == contents_text([p.contents for p in passages])


@pytest.mark.parametrize("line, message", [
    ("{not json", r"c\.jsonl:2: not JSON"),
    ('["a"]', r"c\.jsonl:2: not a JSON object"),
    ({"title": "T", "text": "x"}, r"c\.jsonl:2: 'id' is missing"),
    ({"id": 1.5, "title": "T", "text": "x"}, r"c\.jsonl:2: 'id' is a float"),
    ({"id": "9", "title": "T"}, r"c\.jsonl:2: 'text' is missing"),
    ({"id": "9", "title": "T", "text": 3}, r"c\.jsonl:2: 'text' is a int"),
    ({"id": "9", "contents": "Title\ntext"}, r"c\.jsonl:2: 'contents' does not start with"),
    ({"id": "1", "title": "T", "text": "x"}, r"c\.jsonl:2: id '1' repeats line 1"),
])
def test_load_corpus_bad_lines(tmp_path, line, message):
    path = write_lines(tmp_path / "c.jsonl", [{"id": "1", "title": "A", "text": "a"}, line])
    with pytest.raises(ValueError, match=message) as e:
        read_corpus(path)
    assert "\n" not in str(e.value)


def test_load_corpus_empty(tmp_path):
    with pytest.raises(ValueError, match="no passage"):
        read_corpus(write_lines(tmp_path / "c.jsonl", ["", " "]))


# --------------------------------------------------------------------------------- questions
def test_load_questions_jsonl(tmp_path):
    path = write_lines(tmp_path / "q.jsonl", [
        {"id": "hotpotqa:x", "question": " Who is he ", "golden_answers": ["Him", "he"],
         "data_source": "hotpotqa", "supporting_titles": ["T"]},
        {"question": "What?", "golden_answers": "one", "data_source": "nq"},
        {"question": "Where", "golden_answers": ["here"], "data_source": "nq"},
    ])
    assert read_questions(path) == [
        Question("hotpotqa:x", "Who is he?", ("Him", "he"), "hotpotqa"),
        Question("nq:1", "What?", ("one",), "nq"), Question("nq:2", "Where?", ("here",), "nq")]
    assert [q.id for q in read_questions(path, ["nq"])] == ["nq:1", "nq:2"]
    assert [q.id for q in read_questions(path, "hotpotqa")] == ["hotpotqa:x"]
    with pytest.raises(ValueError, match=r"no question of data source\(s\) \['musique'\]; "
                                         r"the file has \['hotpotqa', 'nq'\]"):
        read_questions(path, ["musique"])


@pytest.mark.parametrize("row, message", [
    ({"question": "q", "data_source": "nq"}, r"q\.jsonl:2: 'golden_answers' is missing"),
    ({"question": "q", "golden_answers": [], "data_source": "nq"},
     r"q\.jsonl:2: 'golden_answers' is empty"),
    ({"question": "q", "golden_answers": [1], "data_source": "nq"}, r"q\.jsonl:2: .*non-string"),
    ({"question": " ", "golden_answers": ["a"], "data_source": "nq"},
     r"q\.jsonl:2: 'question' is empty"),
    ({"golden_answers": ["a"], "data_source": "nq"}, r"q\.jsonl:2: 'question' is missing"),
    ({"question": "q", "golden_answers": ["a"]}, r"q\.jsonl:2: 'data_source' is missing"),
    ({"id": "a", "question": "q", "golden_answers": ["a"], "data_source": "nq"}, r"id 'a' repeats"),
])
def test_load_questions_bad_rows(tmp_path, row, message):
    good = {"id": "a", "question": "q", "golden_answers": ["a"], "data_source": "nq"}
    with pytest.raises(ValueError, match=message) as e:
        read_questions(write_lines(tmp_path / "q.jsonl", [good, row]))
    assert "\n" not in str(e.value)


def verl_agent_row(index, question, target, source):
    """A row as verl-agent's preprocess_search_r1_dataset.py writes it."""
    truth = {"target": target}
    return {"data_source": source,
            "prompt": [{"role": "system", "content": "You are a helpful and harmless assistant."},
                       {"role": "user", "content": question}],
            "ability": "fact-reasoning", "reward_model": {"ground_truth": truth, "style": "rule"},
            "extra_info": {"index": index, "need_tools_kwargs": True, "question": question,
                           "split": "test"},
            "metadata": None,
            "env_kwargs": {"ground_truth": truth, "question": question, "data_source": source}}


def test_load_questions_parquet(tmp_path):
    import pyarrow as pa  # a runtime requirement (requirements.txt): never skipped
    import pyarrow.parquet as pq

    rows = [verl_agent_row(0, "who is he?", ["Him", "he"], "nq"),
            verl_agent_row(1, "where is it", ["here"], "bamboogle")]
    path = str(tmp_path / "test.parquet")
    pq.write_table(pa.Table.from_pylist(rows), path)
    assert read_questions(path) == [Question("nq:0", "who is he?", ("Him", "he"), "nq"),
                                    Question("bamboogle:1", "where is it", ("here",), "bamboogle")]
    assert [q.id for q in read_questions(path, ["bamboogle"])] == ["bamboogle:1"]
    with pytest.raises(ValueError, match=r"the file has \['bamboogle', 'nq'\]"):
        read_questions(path, ["hotpotqa"])

    rows.append(verl_agent_row(2, "q", [], "nq"))
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(ValueError,
                       match=r"test\.parquet: row 2: env_kwargs ground_truth 'target' is empty"):
        read_questions(path)
    pq.write_table(pa.Table.from_pylist([{"question": "q", "golden_answers": ["a"]}]), path)
    with pytest.raises(ValueError, match="no 'env_kwargs' column"):
        read_questions(path)


# ---------------------------------------------------------------------------------- the data
@pytest.fixture
def no_data_env(monkeypatch, tmp_path):
    for name in ("SEARCHQA_DATA", "HGPO_JAX_SEARCHQA_ARCHIVE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HGPO_JAX_CACHE", str(tmp_path / "cache"))
    return tmp_path


def test_project_set_unpacks_and_loads(no_data_env):
    files = default_files()
    assert files["corpus"].startswith(str(no_data_env / "cache" / "searchqa" / "searchqa-small"))
    assert env_data.is_complete(os.path.dirname(files["corpus"]))
    assert default_files() == files  # the unpack is reused
    corpus = read_corpus(files["corpus"])
    train, test = read_questions(files["train"]), read_questions(files["test"])
    assert (len(corpus), len(train), len(test)) == (23694, 1198, 4652)
    assert len({p.id for p in corpus}) == 23694
    assert {q.data_source for q in train} == {"hotpotqa", "musique"}
    assert len(read_questions(files["test"], ["bamboogle"])) == 125
    assert all(q.question.endswith("?") and q.question == q.question.strip() for q in train + test)
    assert resolve_data_dir(os.path.dirname(os.path.dirname(files["corpus"]))) \
        == os.path.dirname(files["corpus"])  # the parent folder works too


def make_archive(folder, name, files, sums):
    src = folder / "src" / "searchqa-small"
    src.mkdir(parents=True)
    for file, text in files.items():
        (src / file).write_text(text)
    (src / "SHA256SUMS").write_text(sums)
    archive = str(folder / name)
    with tarfile.open(archive, "w:xz") as tar:
        tar.add(src, arcname="searchqa-small")
    return archive


def test_damaged_inner_file_is_refused(tmp_path):
    files = {"corpus.jsonl": '{"id": "1", "title": "A", "text": "a"}\n',
             "train.jsonl": "", "test.jsonl": ""}
    archive = make_archive(tmp_path, "bad.tar.xz", files, "0" * 64 + "  corpus.jsonl\n")
    with pytest.raises(SearchDataError, match=r"corpus\.jsonl fails its checksum"):
        data.unpack_archive(archive, str(tmp_path / "cache"))
    assert not os.path.exists(tmp_path / "cache" / "searchqa-small")


def test_data_errors(no_data_env, monkeypatch):
    with pytest.raises(SearchDataError, match="lacks"):
        resolve_data_dir(no_data_env)
    monkeypatch.setenv("SEARCHQA_DATA", str(no_data_env))
    with pytest.raises(SearchDataError, match=r"\$SEARCHQA_DATA"):
        resolve_data_dir()
    monkeypatch.delenv("SEARCHQA_DATA")
    monkeypatch.setattr(env_data, "candidate_archives",
                        lambda env, name, override=None: [str(no_data_env / "none.tar.xz")])
    with pytest.raises(SearchDataError, match="SEARCHQA_DATA") as e:
        default_files()
    assert "none.tar.xz" in str(e.value)
