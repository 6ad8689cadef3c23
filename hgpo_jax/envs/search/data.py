"""Where the search-QA data lives and how passages and questions are read.

Lookup order of the data folder: the `data_dir` argument, else `$SEARCHQA_DATA`, else the project's
small set (`../shared/data/searchqa/searchqa-small-v1.tar.xz`, or `$HGPO_JAX_SEARCHQA_ARCHIVE`),
checked against its sha256, unpacked once, atomically, into `$HGPO_JAX_CACHE/searchqa/` and its
files checked against the `SHA256SUMS` inside (hgpo_jax.envs.data).

A data folder holds `corpus.jsonl` (passages), `train.jsonl` and `test.jsonl` (questions). The small
set is real Wikipedia paragraphs (HotpotQA, MuSiQue, 2Wiki) and real questions of Search-R1's seven
data sources; it is not wiki-18 and has no e5 index, so EM on it is not comparable to the papers'
tables (shared/data/searchqa/README.md).

Readers accept the project's formats and the authors': passages as `{id, title, text}` or
wiki-18's `{id, contents}`; questions as the project's JSONL rows or the parquet verl-agent trains
on (`examples/data_preprocess/preprocess_search_r1_dataset.py`: the env reads each row's
`env_kwargs = {ground_truth: {target: [...]}, question, data_source}`). Bad rows fail at load with
one line naming the file and the line (JSONL, from 1) or row (parquet, from 0).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from hgpo_jax.envs import data
from hgpo_jax.envs.search.text import prepare_question, wiki_contents

ARCHIVE_NAME = "searchqa-small-v1.tar.xz"
DATA_FOLDER = "searchqa-small"
CORPUS_FILE = "corpus.jsonl"
TRAIN_FILE = "train.jsonl"
TEST_FILE = "test.jsonl"
SUMS_FILE = "SHA256SUMS"
REQUIRED_FILES = (CORPUS_FILE, TRAIN_FILE, TEST_FILE)

_HOW_TO_GET_DATA = (
    "Search-QA data not found. Pass data_dir=/path to a folder holding "
    f"{', '.join(REQUIRED_FILES)}, set $SEARCHQA_DATA, or put the project's archive "
    f"shared/data/searchqa/{ARCHIVE_NAME} beside the checkout (or point "
    "$HGPO_JAX_SEARCHQA_ARCHIVE at it). Looked in: {looked}")


class SearchDataError(FileNotFoundError):
    """The search-QA data cannot be found or is damaged."""


# ------------------------------------------------------------------------------ data folder
def _data_folder(path: str) -> str | None:
    """`path` or `path/searchqa-small` if it holds the required files, else None."""
    return data.required_folder(path, DATA_FOLDER, REQUIRED_FILES)


def check_sums(folder: str) -> None:
    """Check the files listed in `folder/SHA256SUMS` (sha256sum format), if it exists; raises
    SearchDataError naming the first file that is missing or differs."""
    sums = os.path.join(folder, SUMS_FILE)
    if not os.path.isfile(sums):
        return
    with open(sums, encoding="utf-8") as f:
        lines = [line.split(None, 1) for line in f if line.strip()]
    for expected, name in lines:
        name = name.strip().lstrip("*")  # "*" marks binary mode in sha256sum's format
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            raise SearchDataError(f"{path} is missing ({sums} lists it)")
        if data.file_sha256(path) != expected.lower():
            raise SearchDataError(f"{path} fails its checksum ({sums}): the archive is damaged")


def _checked_data_folder(path: str) -> str | None:
    """`_data_folder`, with its SHA256SUMS checked (the unpack's one-time check)."""
    folder = _data_folder(path)
    if folder is not None:
        check_sums(folder)
    return folder


def unpack_archive(archive: str, dest_root: str) -> str:
    """Unpack the small-set archive into `dest_root/searchqa-small` once, atomically; the archive
    is checked against its `.sha256` and the unpacked files against the inner SHA256SUMS."""
    return data.unpack_archive(archive, dest_root, DATA_FOLDER, _checked_data_folder,
                               SearchDataError)


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> str:
    """The folder holding the search-QA files (see the module docstring for the lookup order)."""
    return data.resolve_env_data(
        "searchqa", ARCHIVE_NAME, DATA_FOLDER, REQUIRED_FILES,
        ((data_dir, "data_dir"), (os.environ.get("SEARCHQA_DATA"), "$SEARCHQA_DATA")),
        os.environ.get("HGPO_JAX_SEARCHQA_ARCHIVE"), _HOW_TO_GET_DATA, SearchDataError,
        find=_checked_data_folder)


def default_files(data_dir: str | os.PathLike | None = None) -> dict[str, str]:
    """{"corpus", "train", "test"}: the paths of the data folder's files (`resolve_data_dir`),
    unpacking the project's archive on first use."""
    folder = resolve_data_dir(data_dir)
    return {"corpus": os.path.join(folder, CORPUS_FILE),
            "train": os.path.join(folder, TRAIN_FILE),
            "test": os.path.join(folder, TEST_FILE)}


# ---------------------------------------------------------------------------------- passages
@dataclass(frozen=True)
class Passage:
    """One retrievable passage. `contents` is wiki-18's form, the string a retriever returns and
    the observation shows (hgpo_jax.envs.search.text)."""

    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        return wiki_contents(self.title, self.text)


def _jsonl_rows(path: str) -> Iterator[tuple[int, dict]]:
    """(line number from 1, object) of each non-blank line; a line that is not a JSON object is a
    one-line ValueError."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"{path}:{number}: not JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{number}: not a JSON object but {type(row).__name__}")
            yield number, row


def _text_field(row: dict, key: str, where: str) -> str:
    value = row.get(key)
    if not isinstance(value, str):
        what = "missing" if key not in row else f"a {type(value).__name__}, not a string"
        raise ValueError(f"{where}: {key!r} is {what}")
    return value


def _split_contents(contents: str, where: str) -> tuple[str, str]:
    """(title, text) of wiki-18 contents `"Title"\\ntext`: the first line without its one pair of
    enclosing quotes, and the rest exactly (text "" when there is no newline: the observation is
    the same, since contents are stripped when shown). A first line not in quotes is refused, as
    the passage could then not give back its contents."""
    title, _, text = contents.partition("\n")
    if len(title) < 2 or title[0] != '"' or title[-1] != '"':
        raise ValueError(f"{where}: 'contents' does not start with a quoted title line "
                         f"('\"Title\"\\ntext'): {title[:60]!r}")
    return title[1:-1], text


def read_corpus(path: str | os.PathLike) -> list[Passage]:
    """The passages of a JSONL corpus, in file order.

    Each line is `{"id", "title", "text"}` (the project's set) or wiki-18's `{"id", "contents"}`
    (title and text are split from the contents, see `_split_contents`; other keys are ignored).
    Ids are strings (an integer id is taken as its decimal string) and must be unique. Raises a
    one-line ValueError naming the file and line for a bad line, and for an empty corpus.
    """
    path = os.fspath(path)
    passages = []
    seen: dict[str, int] = {}
    for number, row in _jsonl_rows(path):
        where = f"{path}:{number}"
        pid = row.get("id")
        if isinstance(pid, int) and not isinstance(pid, bool):
            pid = str(pid)
        elif not isinstance(pid, str):
            what = "missing" if "id" not in row else f"a {type(pid).__name__}"
            raise ValueError(f"{where}: 'id' is {what}, not a string")
        if pid in seen:
            raise ValueError(f"{where}: id {pid!r} repeats line {seen[pid]}")
        seen[pid] = number
        if "title" in row or "contents" not in row:
            title, text = _text_field(row, "title", where), _text_field(row, "text", where)
        else:
            title, text = _split_contents(_text_field(row, "contents", where), where)
        passages.append(Passage(pid, title, text))
    if not passages:
        raise ValueError(f"{path}: the corpus holds no passage")
    return passages


# --------------------------------------------------------------------------------- questions
@dataclass(frozen=True)
class Question:
    """One task: the question as the policy reads it, the answers any of which scores EM 1, and
    the data source its success rate is reported under (Search-R1's names: nq, triviaqa, popqa,
    hotpotqa, 2wikimultihopqa, musique, bamboogle)."""

    id: str
    question: str
    golden_answers: tuple[str, ...]
    data_source: str


def _answers(value, where: str, key: str) -> tuple[str, ...]:
    """Golden answers as a tuple: a list of strings, or one string (their EM check takes a string
    as one answer). Missing, empty or non-string answers are refused: EM could never be 1."""
    if isinstance(value, str):
        value = [value]
    if value is None or not isinstance(value, (list, tuple)):
        what = "missing" if value is None else f"a {type(value).__name__}"
        raise ValueError(f"{where}: {key} is {what}, not a list of answers")
    if not value:
        raise ValueError(f"{where}: {key} is empty: the question has no answer")
    if not all(isinstance(a, str) for a in value):
        raise ValueError(f"{where}: {key} holds a non-string answer: {value!r:.120}")
    return tuple(value)


def _jsonl_questions(path: str) -> Iterator[Question]:
    """The project's rows `{id?, question, golden_answers, data_source, ...}`; the question is
    prepared as Search-R1's scripts do (`prepare_question`)."""
    for index, (number, row) in enumerate(_jsonl_rows(path)):
        where = f"{path}:{number}"
        source = _text_field(row, "data_source", where)
        question = _text_field(row, "question", where)
        if not question.strip():
            raise ValueError(f"{where}: 'question' is empty")
        question = prepare_question(question)
        answers = _answers(row.get("golden_answers"), where, "'golden_answers'")
        qid = row.get("id", f"{source}:{index}")
        if not isinstance(qid, str):
            raise ValueError(f"{where}: 'id' is a {type(qid).__name__}, not a string")
        yield Question(qid, question, answers, source)


def _read_parquet_rows(path: str) -> list:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(f"reading {path} needs pyarrow (pip install pyarrow), or convert it "
                          "to JSONL rows {question, golden_answers, data_source}") from None
    schema = pq.read_schema(path)
    if "env_kwargs" not in schema.names:
        raise ValueError(f"{path}: no 'env_kwargs' column (expected the parquet of verl-agent's "
                         f"preprocess_search_r1_dataset.py; columns: {schema.names})")
    return pq.read_table(path, columns=["env_kwargs"]).column("env_kwargs").to_pylist()


def _parquet_questions(path: str) -> Iterator[Question]:
    """verl-agent's rows: `env_kwargs = {ground_truth: {target: [...]}, question, data_source}`,
    the three things their env reads. The question is kept as the file has it (their preprocess
    copies it; Search-R1 prepared it upstream). Ids are `{data_source}:{row}`."""
    for index, kwargs in enumerate(_read_parquet_rows(path)):
        where = f"{path}: row {index}"
        if not isinstance(kwargs, dict):
            raise ValueError(f"{where}: env_kwargs is missing")
        source = _text_field(kwargs, "data_source", f"{where}: env_kwargs")
        question = _text_field(kwargs, "question", f"{where}: env_kwargs")
        if not question.strip():
            raise ValueError(f"{where}: env_kwargs 'question' is empty")
        truth = kwargs.get("ground_truth")
        if not isinstance(truth, dict):
            what = "missing" if truth is None else f"a {type(truth).__name__}"
            raise ValueError(f"{where}: env_kwargs 'ground_truth' is {what}, not "
                             "{'target': [answers]} (their EM reads ground_truth['target'])")
        answers = _answers(truth.get("target"), where, "env_kwargs ground_truth 'target'")
        yield Question(f"{source}:{index}", question, answers, source)


def read_questions(path: str | os.PathLike,
                   data_sources: Iterable[str] | None = None) -> list[Question]:
    """The questions of a JSONL file (the project's rows) or a `.parquet` file (verl-agent's rows),
    in file order, keeping only the given data sources when `data_sources` is a list of names.

    JSONL questions are prepared (strip, "?" appended, `prepare_question`) since the project's
    files hold the raw FlashRAG/HotpotQA text; parquet questions are kept as verl-agent would show
    them. Ids: the row's `id` (JSONL), else `{data_source}:{row index}` (index from 0 over the
    file's rows, before filtering). Every row is checked; a row without answers, a bad row, a
    repeated id, an empty file, or a filter that keeps nothing is a one-line ValueError.
    """
    path = os.fspath(path)
    rows = _parquet_questions(path) if path.endswith(".parquet") else _jsonl_questions(path)
    questions = list(rows)
    if not questions:
        raise ValueError(f"{path}: the file holds no question")
    seen: dict[str, int] = {}
    for index, q in enumerate(questions):
        if q.id in seen:
            raise ValueError(f"{path}: id {q.id!r} repeats (rows {seen[q.id]} and {index}, from 0)")
        seen[q.id] = index
    if data_sources is None:
        return questions
    if isinstance(data_sources, str):
        data_sources = [data_sources]
    wanted = set(data_sources)
    kept = [q for q in questions if q.data_source in wanted]
    if not kept:
        have = sorted({q.data_source for q in questions})
        raise ValueError(f"{path}: no question of data source(s) {sorted(wanted)}; "
                         f"the file has {have}")
    return kept
