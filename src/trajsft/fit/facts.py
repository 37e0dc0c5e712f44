"""The student's architecture facts in the config, checked against the checkpoint's own ``config.json``.

An ``init: hf`` student's dimensions (``students.<name>.model``), ``rope_theta`` and ``vocab_size`` live in
the config beside its pinned revision, so the fit check compiles the right model with no download. When
the checkpoint's ``config.json`` can be read (its sealed ``models/`` snapshot, a local dir, or the Hub at the
pinned revision within a few seconds), every fact is compared with it; a mismatch is one line naming the
config key. Offline, the check says it was not done and goes on.
"""

from __future__ import annotations

import json
import os
from typing import Callable, Optional

from ..errors import ConfigError
from ..plan.specs import StudentSpec

# Levanter's Qwen3 field -> the HF config.json key
HF_KEYS = {"hidden_dim": "hidden_size", "intermediate_dim": "intermediate_size", "num_layers": "num_hidden_layers",
           "num_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads", "head_dim": "head_dim"}


def fetch_hub_config(repo: str, revision: Optional[str], timeout: float = 5.0) -> Optional[dict]:
    """``config.json`` of a Hub repo at a revision, or None when the Hub cannot be reached in ``timeout`` s
    (HF_TOKEN is sent as huggingface_hub sends it, never logged)."""
    import requests
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    try:
        r = requests.get(hf_hub_url(repo, "config.json", revision=revision), headers=build_hf_headers(),
                         timeout=timeout)
    except requests.RequestException:
        return None
    if r.status_code != 200:
        return None
    try:
        return r.json()
    except ValueError:
        return None


def snapshot_config(location: Optional[str]) -> Optional[dict]:
    """``config.json`` of the student's sealed ``models/`` snapshot at ``location`` (None: not made yet)."""
    from .. import io, storage

    if not location or not storage.reachable(root := storage.absolute(location)):
        return None
    try:
        if storage.read_seal(location) is None:
            return None
        return io.read_json(io.join(location, "config.json"))
    except (OSError, ValueError) as e:  # a bucket that refuses us (401/403) included: said by check(), not raised
        if io.is_remote(root):
            storage.note_refusal(root, e)
        return None


def check(student: StudentSpec, fetch: Callable[[str, Optional[str]], Optional[dict]] = fetch_hub_config,
          snapshot: Optional[str] = None) -> str:
    """One line saying what was checked; ConfigError (one line) on a mismatch. ``snapshot``: the location of
    the checkpoint's ``models/`` snapshot, read first when it is sealed (no Hub needed)."""
    ref = student.hf_checkpoint
    if student.init != "hf" or ref is None:
        return "random-init student: no checkpoint config to check"
    where = ref.hub_ref() if ref.local is None else ref.local
    hf = snapshot_config(snapshot)
    if hf is not None:
        where = f"{where} (snapshot {snapshot})"
    elif ref.local is not None:
        path = os.path.join(ref.local, "config.json")
        try:
            with open(path) as f:
                hf = json.load(f)
        except (OSError, ValueError):
            return f"not checked: {path} is not readable"
    else:
        hf = fetch(ref.ref, ref.revision)
        if hf is None:
            from .. import storage

            why = snapshot and storage.refused(storage.absolute(snapshot))
            said = f"; its snapshot's bucket refused: {why}" if why else ""
            return f"not checked: {where} config.json not reachable (offline?){said}; using the config's facts"
    dims = student.model.dims()
    wrong = [f"students.{student.name}.model.{k} {dims[k]} but config.json {hf_key} {hf.get(hf_key)}"
             for k, hf_key in HF_KEYS.items() if k in dims and hf_key in hf and int(hf[hf_key]) != int(dims[k])]
    if "rope_theta" in hf and float(hf["rope_theta"]) != float(student.rope_theta):
        wrong.append(f"students.{student.name}.rope_theta {student.rope_theta:g} but config.json rope_theta "
                     f"{float(hf['rope_theta']):g}")
    if student.vocab_size and "vocab_size" in hf and int(student.vocab_size) > int(hf["vocab_size"]):
        wrong.append(f"students.{student.name}.vocab_size {student.vocab_size} exceeds config.json vocab_size "
                     f"{hf['vocab_size']}")
    if wrong:
        raise ConfigError(f"{where}: the config's architecture facts differ from the checkpoint: " + "; ".join(wrong))
    return f"matches {where} config.json"
