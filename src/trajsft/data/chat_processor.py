"""Levanter's ``ChatProcessor`` with the teacher's tools: every chat renders as the template renders ``tools``.

Levanter's processor calls ``apply_chat_template`` without ``tools``, so a chat would train without the ``# Tools``
block the teacher's prompt held. This one passes the teacher's tools (:mod:`trajsft.plan.tools`) on every call, also
in the tokenize pool's forked workers (they run this object). The block comes before the first message, outside every
``{% generation %}`` span, so the assistant-only mask covers the same generated text. With no tools it is Levanter's
processor unchanged.

The cache ledger keeps Levanter's processor metadata (the keys ``train_lm`` compares when it loads the cache, so it
loads without a mismatch warning); which tools a cache was rendered with is in the tokenized manifest and hash.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
from levanter.data.text import ChatProcessor


class ToolsChatProcessor(ChatProcessor):
    def __init__(self, tokenizer, chat_template: str, tools: Optional[list[dict]] = None,
                 messages_field: str = "messages", mask_user_turns: bool = True):
        super().__init__(tokenizer, chat_template=chat_template, messages_field=messages_field,
                         mask_user_turns=mask_user_turns)
        self.tools = list(tools) if tools else None

    def __call__(self, batch: Sequence[dict]):
        if not self.tools:
            return super().__call__(batch)
        tokenized = self.tokenizer.apply_chat_template(
            [example[self.messages_field] for example in batch], tools=self.tools, tokenize=True,
            chat_template=self.chat_template, return_assistant_tokens_mask=True, return_dict=True)
        out = []
        for example, ids, mask in zip(batch, tokenized["input_ids"], tokenized["assistant_masks"]):
            if not np.any(mask):  # as Levanter's processor: a chat must train on something
                raise ValueError(f"Chat did not contain an assistant message for sequence {example}")
            out.append({"input_ids": np.array(ids, dtype=np.int32), "assistant_masks": np.array(mask, dtype=np.int32)})
        return out


def tools_block_tokens(tokenizer, chat_template: str, tools: Optional[list[dict]]) -> int:
    """Tokens the tools block adds to every chat (0: no tools): a one-turn chat rendered with and without them."""
    if not tools:
        return 0
    chat = [{"role": "user", "content": "x"}]
    with_tools = tokenizer.apply_chat_template(chat, tools=tools, tokenize=True, chat_template=chat_template)
    return len(with_tools) - len(tokenizer.apply_chat_template(chat, tokenize=True, chat_template=chat_template))
