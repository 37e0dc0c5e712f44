"""Shared settings of the benchmark: paths, default sizes, the length profile of the synthetic chats."""

from __future__ import annotations

import sys
import math
from dataclasses import dataclass
from pathlib import Path


REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT / "src") not in sys.path:
    sys.path.insert(0, str(REPO_ROOT / "src"))

DEFAULT_TOKENIZER = str(REPO_ROOT / "demo" / "tokenizer")
DEFAULT_CHATS = 200
DEFAULT_SEQ_LEN = 32768
DEFAULT_SCALE_CHATS = 128  # the 16x set of the tokenize scaling runs (~2M Qwen3 tokens)
DEFAULT_PROFILE_CHATS = 5000
BATCH_SIZE = 128  # levanter.store.cache.CacheOptions.default().batch_size
WARMUP_CHATS = 32
MAX_SEGMENTS_PER_EXAMPLE = 64  # levanter.data.text.dataset_for_format (pack=True)
# tokens per turn outside the content budgets: template (~27) + output wrapper, JSON and command excess (~28);
# measured with the demo tokenizer (generated lengths land within a few % of the target)
OVERHEAD_TOKENS_PER_TURN = 55


@dataclass(frozen=True)
class LengthProfile:
    """Parameters of the synthetic length profile (all lengths in tokens)."""

    median_tokens: float = 12000.0
    sigma: float = 0.68  # log-space std: P(L > 32768) ~ 7% at median 12000
    min_tokens: int = 1500
    max_tokens: int = 131072
    turn_tokens_median: float = 400.0
    turn_tokens_sigma: float = 0.35
    min_turns: int = 10
    max_turns: int = 80
    thought_share: tuple = (0.05, 0.20)
    command_tokens: tuple = (10, 40)
    user_tokens: tuple = (200, 600)
    closing_tokens: tuple = (40, 200)

    def tail_share(self, seq_len: int) -> float:
        """Expected share of chats longer than ``seq_len`` (ignoring the clip)."""
        z = math.log(seq_len / self.median_tokens) / self.sigma
        return 0.5 * math.erfc(z / math.sqrt(2))
