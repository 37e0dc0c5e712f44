"""The demo tokenizer: a small byte-level BPE trained on the rendered demo chats."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from trajsft.data.template import load_template, strip_generation_tags

from .settings import ADDED_TOKENS, QWEN_SPLIT_PATTERN, SPECIAL_TOKENS, VOCAB_SIZE


def _render_env() -> jinja2.Environment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
    return env


def training_corpus(rows: list[dict]) -> list[str]:
    """Rendered chats (official template text) of every row that renders."""
    tmpl = _render_env().from_string(strip_generation_tags(load_template()))
    texts = []
    for row in rows:
        try:
            msgs = json.loads(row["messages"])
            msgs = [m for m in msgs if m.get("role") != "exit"]
            texts.append(tmpl.render(messages=msgs, add_generation_prompt=False))
        except Exception:
            texts.append(row["messages"])
        texts.append(row["patch"])
    return texts


def build_tokenizer(corpus: list[str], out_dir: Path) -> int:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False, fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    # Strip the added tokens from the training text so BPE does not spend merges on them.
    pattern = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS + ADDED_TOKENS))
    tok.train_from_iterator([pattern.sub("\n", t) for t in corpus], trainer=trainer, length=len(corpus))
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=131072,
        padding_side="right",
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        errors="replace",
        add_prefix_space=False,
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        chat_template=load_template(),
    )
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    # Keep the template inside tokenizer_config.json (not a separate chat_template.jinja) so
    # that older transformers versions pick it up too.
    fast.save_pretrained(str(out_dir), save_jinja_files=False)
    return len(fast)
