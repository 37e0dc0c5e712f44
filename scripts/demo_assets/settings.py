"""Fixed settings of the demo assets: the seed, sizes, the student's special tokens."""

from __future__ import annotations

import sys
from pathlib import Path


REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "src"))

SEED = 20250601
N_ROWS = 60
N_SHARDS = 2
MODEL_NAME = "claude-sonnet-4-5-20250929"
VOCAB_SIZE = 2000  # BPE vocab incl. byte alphabet and the 3 special tokens; +6 added tokens

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
# Qwen2/Qwen3 pre-tokenizer split pattern.
QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
