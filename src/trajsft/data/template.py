"""The project's Qwen3 chat template (official Qwen3 template + ``{% generation %}`` markers).

The template in ``templates/qwen3_chat_template.jinja`` renders byte-identically to the
chat template shipped with the Qwen3 models.  The only addition is a
``{% generation %}`` ... ``{% endgeneration %}`` block around the part of every assistant
turn that the model generates (everything after ``<|im_start|>assistant\\n`` up to and
including ``<|im_end|>``), which lets transformers' ``apply_chat_template(...,
return_assistant_tokens_mask=True, return_dict=True)`` build assistant-only loss masks.
When no mask is requested transformers treats the block as a no-op.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from pathlib import Path

TEMPLATE_PATH: Path = Path(__file__).resolve().parent / "templates" / "qwen3_chat_template.jinja"

# A generation tag: {% generation %}, {%- generation -%}, {% endgeneration %}, ...
_TAG = r"\{%-?\s*(?:end)?generation\s*-?%\}"
# A tag that sits alone on its line: drop the whole line (indentation and newline included).
_TAG_LINE_RE = re.compile(r"^[ \t]*" + _TAG + r"[ \t]*(?:\r?\n|\Z)", re.MULTILINE)
_TAG_RE = re.compile(_TAG)


@lru_cache(maxsize=1)
def load_template() -> str:
    """Return the chat template text (with generation markers)."""
    return TEMPLATE_PATH.read_text(encoding="utf-8")


def template_sha256() -> str:
    """Hex SHA-256 of the template file bytes (for provenance / cache keys)."""
    return hashlib.sha256(TEMPLATE_PATH.read_bytes()).hexdigest()


def strip_generation_tags(text: str) -> str:
    """Remove ``{% generation %}`` / ``{% endgeneration %}`` tags from a template.

    Tags on a line of their own are removed together with that line; inline tags are
    removed in place.  The result is a plain Jinja template that renders the same text
    as the original does in transformers (where the tags are no-ops unless an assistant
    mask is requested), also in a Jinja environment without the generation extension.
    """
    return _TAG_RE.sub("", _TAG_LINE_RE.sub("", text))
