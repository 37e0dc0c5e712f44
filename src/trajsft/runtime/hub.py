"""The Hugging Face Hub as every step reads it: a repo at a pinned revision, its failures said in one line naming
the repo (a teacher's dataset, a task set's instances, a student's checkpoint)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Sequence

from ..errors import DataError, network_cause, one_line


@contextlib.contextmanager
def hub_errors(what: str):
    """Hub failures inside the block as one line naming ``what`` (``repo@revision``)."""
    from huggingface_hub.errors import HfHubHTTPError

    try:
        yield
    except HfHubHTTPError as e:
        status = getattr(e.response, "status_code", "?")
        hint = ((" (HF_TOKEN was refused, or has no access to this repo)" if os.environ.get("HF_TOKEN")
                 else " (set HF_TOKEN for gated/private repos)") if status in (401, 403) else "")
        raise DataError(f"{what}: Hugging Face Hub answered HTTP {status}{hint}") from None
    except OSError as e:  # offline, DNS, a download cut short (huggingface_hub's consistency check) ...
        if type(e).__name__ == "OfflineModeIsEnabled":
            raise DataError(f"{what}: not downloaded: HF_HUB_OFFLINE is set (unset it to download)") from None
        why = network_cause(e)  # the root cause, named as `trajsft plan` names it
        if why:
            raise DataError(f"{what}: cannot reach the Hugging Face Hub: {why}") from None
        raise DataError(f"{what}: download from the Hugging Face Hub failed ({type(e).__name__}: {one_line(e, 400)})") from None


def dataset_snapshot(dataset: str, revision: str, dest: Path, patterns: Sequence[str]) -> str:
    """The files of a dataset repo at a pinned revision matching ``patterns``, into ``dest``; the resolved commit
    sha. HF_TOKEN is honoured and never logged."""
    from huggingface_hub import HfApi, snapshot_download

    token = os.environ.get("HF_TOKEN") or None
    with hub_errors(f"{dataset}@{revision}"):
        sha = HfApi(token=token).dataset_info(dataset, revision=revision).sha or revision
        snapshot_download(repo_id=dataset, repo_type="dataset", revision=sha, token=token, local_dir=str(dest),
                          allow_patterns=list(patterns))
    return sha
