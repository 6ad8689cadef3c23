"""Tokenizer: a thin wrapper over the Hugging Face tokenizer of a model folder and its chat template."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

# The chat template of Qwen2.5-Instruct's tokenizer, verbatim (a data format we must match: the
# rollout prompts of the authors' runs are rendered with it). Without a system message it opens
# with Qwen's default system prompt. Models built here (hgpo_jax.models.tiny) carry it too.
QWEN2_5_CHAT_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{{\\\"name\\\": <function-name>, "
    "\\\"arguments\\\": <args-json-object>}}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
    "            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n")

# The files of a model folder any one of which `load_tokenizer` takes as its tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")

# Plain ChatML, used when a tokenizer folder ships without a chat template.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


# Keywords every chat template is rendered with. Qwen3's template has a thinking switch: verl-agent's
# Qwen3 runs set `enable_thinking=False` (`+data.apply_chat_template_kwargs.enable_thinking=False`,
# examples/gigpo_trainer/run_webshop_qwen3.sh), which makes the template open the reply with an
# empty `<think>\n\n</think>\n\n`; the agents' prompts then ask for the reasoning in the reply's own
# <think> tags, as with Qwen2.5. Templates without the switch (Qwen2.5, Llama, the ones built
# here) ignore it.
CHAT_TEMPLATE_KWARGS = {"enable_thinking": False}


class Tokenizer:
    """Encode/decode text and render chat prompts; wraps `transformers.AutoTokenizer`.

    Attributes: `eos_token_ids` (every id that ends a reply: the tokenizer's eos, `<|im_end|>`
    when present, and `extra_eos_ids`: those the folder's generation_config.json lists, e.g.
    Llama 3's <|eot_id|> and <|eom_id|>), `pad_token_id`, `vocab_size`, `end_of_turn_id`.
    """

    def __init__(self, hf_tokenizer, extra_eos_ids: Sequence[int] = ()):
        self.hf = hf_tokenizer
        if not getattr(self.hf, "chat_template", None):
            self.hf.chat_template = CHATML_TEMPLATE
        eos = [self.hf.eos_token_id] if self.hf.eos_token_id is not None else []
        im_end = self.hf.convert_tokens_to_ids("<|im_end|>")
        has_im_end = isinstance(im_end, int) and im_end != self.hf.unk_token_id
        if has_im_end and im_end not in eos:
            eos.append(im_end)
        # supervised replies end with <|im_end|> where the vocabulary has it, else with the eos
        self._end_of_turn = im_end if has_im_end else (eos[0] if eos else 0)
        eos += [int(i) for i in extra_eos_ids if int(i) not in eos]
        self.eos_token_ids: list[int] = eos
        pad = self.hf.pad_token_id
        self.pad_token_id: int = pad if pad is not None else (eos[0] if eos else 0)

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @property
    def end_of_turn_id(self) -> int:
        """The token that ends an assistant turn: `<|im_end|>` when the vocabulary has it, else
        the eos token (supervised responses end with it, so the model learns to stop)."""
        return self._end_of_turn

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def chat_prompt(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """[{'role': 'user', 'content': ...}, ...] -> token ids of the rendered chat template."""
        text = self.hf.apply_chat_template(messages, tokenize=False,
                                           add_generation_prompt=add_generation_prompt,
                                           **CHAT_TEMPLATE_KWARGS)
        return self.encode(text)

    def save_pretrained(self, out_dir: str) -> None:
        self.hf.save_pretrained(out_dir)


def has_tokenizer_files(folder: str) -> bool:
    """Whether `folder` holds a tokenizer file `load_tokenizer` can start from (TOKENIZER_FILES)."""
    return any(os.path.isfile(os.path.join(folder, f)) for f in TOKENIZER_FILES)


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """Load the tokenizer files of a local HF model folder (never downloads)."""
    from transformers import AutoTokenizer  # imported lazily: transformers is slow to import

    folder = os.fspath(path)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"tokenizer folder {folder!r} does not exist")
    if not has_tokenizer_files(folder):
        raise FileNotFoundError(f"{folder} holds no tokenizer files (tokenizer.json or "
                                "tokenizer_config.json); copy them from the HF model folder")
    try:
        hf = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except Exception as e:  # transformers raises many types here; say which folder failed
        raise ValueError(f"cannot load the tokenizer in {folder}: {e}") from e
    _keep_file_pipeline(hf, os.path.join(folder, "tokenizer.json"))
    return Tokenizer(hf, generation_eos_ids(folder))


def generation_eos_ids(folder: str) -> list[int]:
    """The eos ids of a folder's generation_config.json (transformers stops generating at any of
    them: Llama 3 Instruct lists <|end_of_text|>, <|eom_id|>, <|eot_id|>); [] without the file."""
    path = os.path.join(folder, "generation_config.json")
    if not os.path.isfile(path):
        return []
    try:
        with open(path, encoding="utf-8") as f:
            eos = json.load(f).get("eos_token_id")
    except (OSError, ValueError, AttributeError) as e:
        raise ValueError(f"{path}: cannot read the generation config: {e}") from e
    ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError(f"{path}: eos_token_id must be an int or a list of ints, got {eos!r}")
    return ids


def _keep_file_pipeline(hf, tokenizer_json: str) -> None:
    """Make the folder's tokenizer.json authoritative for normalization and pre-tokenization.

    transformers picks the tokenizer class from config.json's model type and the Qwen2 class
    rebuilds its pre-tokenizer (Qwen's word-splitting regex) and normalizer whatever the file
    says. For a real Qwen2.5 folder that changes nothing; for the tokenizers trained here (merges
    across spaces, hgpo_jax.models.local) it would re-split every word and double the prompts.
    """
    if not os.path.isfile(tokenizer_json):
        return
    from tokenizers import Tokenizer as RawTokenizer

    raw = RawTokenizer.from_file(tokenizer_json)
    backend = hf.backend_tokenizer
    if str(backend.pre_tokenizer) != str(raw.pre_tokenizer):
        backend.pre_tokenizer = raw.pre_tokenizer
    if str(backend.normalizer) != str(raw.normalizer):
        backend.normalizer = raw.normalizer
