"""Step ``model``: the student's initial weights (``init: hf``) as an artifact under the storage root.

``<storage_root>/models/<repo>-<hash>/`` holds the checkpoint at its pinned revision: ``config.json``, the
safetensors weights (and their index), the tokenizer and generation files; nothing else of the repo. It is
made once (rule ``download_model``), as marin's model-download step does, and every training host of every
slice attempt initialises from it (``initialize_from_hf: <that location>``), as does the HF export's reference
config: the Hub, ``HF_TOKEN`` and the Hub's rate limits are off the training hosts' critical path.

Every file is verified before it is sealed: against the Hub's own metadata of that revision (its size, and
its LFS sha256 or git blob sha1) for a Hub repo, against the source's md5 for a local dir (a local model
standing in for the Hub). The download goes through the Hugging Face cache (resumable, shared with other
tools), then each file is streamed to the location with its md5 checked on the way
(:func:`trajsft.storage.copy_object`); :func:`trajsft.storage.build` seals the payload last. Before anything
is downloaded, the space it needs is checked (:func:`check_disk`: the files the cache lacks, and their copy
under a local storage root): a disk too small is one line with the figures, not a full disk midway.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
from pathlib import Path

from .. import io, storage
from ..runtime.hub import hub_errors
from ..errors import DataError
from ..plan.step_configs import ModelConfig

log = logging.getLogger("trajsft")

# what Levanter's HF converter and the tokenizer read; weights in safetensors only
PATTERNS = ("*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja")
CHUNK = 8 << 20
# config.json facts recorded in the manifest (what ``trajsft fit`` checks the student's dimensions against)
ARCHITECTURE_KEYS = ("architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "rope_theta",
                     "max_position_embeddings", "tie_word_embeddings", "torch_dtype")


def wanted(rel: str) -> bool:
    return any(fnmatch.fnmatch(rel, p) for p in PATTERNS)


def _digests(path: Path) -> dict:
    """size, md5, sha256 and the git blob sha1 of a file, in one read."""
    md5, sha256, blob = hashlib.md5(), hashlib.sha256(), hashlib.sha1()
    size = path.stat().st_size
    blob.update(f"blob {size}\0".encode())
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            for h in (md5, sha256, blob):
                h.update(chunk)
    return {"size": size, "md5": md5.hexdigest(), "sha256": sha256.hexdigest(), "git_sha1": blob.hexdigest()}


def _check_files(source: str, files: list[str], where: str) -> None:
    if "config.json" not in files:
        raise DataError(f"{source}: no config.json ({where})")
    if not any(f.endswith(".safetensors") for f in files):
        raise DataError(f"{source}: no safetensors weights (Levanter initialises from *.safetensors) ({where})")


def _from_hub(repo: str, revision: str | None, where: str,
              local_root: str | None = None) -> tuple[Path, dict[str, dict], str]:
    """Download the wanted files of ``repo`` at ``revision`` into the HF cache and check each one against
    the Hub's metadata: (snapshot dir, {file: digests}, resolved commit)."""
    from huggingface_hub import HfApi, snapshot_download

    token = os.environ.get("HF_TOKEN") or None  # honoured, never logged
    with hub_errors(f"{repo}@{revision}"):
        info = HfApi(token=token).model_info(repo, revision=revision, files_metadata=True)
        sha = info.sha or revision
        meta = {s.rfilename: s for s in info.siblings or [] if wanted(s.rfilename)}
        _check_files(f"{repo}@{revision}", list(meta), where)
        log.info("downloading %d files of %s at %s (%.2f GB)", len(meta), repo, sha,
                 sum((s.size or 0) for s in meta.values()) / 1e9)
        check_disk(f"{repo}@{sha}", _not_cached(repo, sha, meta), local_root)
        snap = Path(snapshot_download(repo_id=repo, revision=sha, token=token, allow_patterns=sorted(meta)))
    files = {}
    for rel, s in sorted(meta.items()):
        d = _digests(snap / rel)
        lfs = s.lfs
        expect = ((lfs.size if lfs else s.size), (lfs.sha256 if lfs else s.blob_id))
        got = (d["size"], d["sha256"] if lfs else d["git_sha1"])
        if (expect[0] is not None and got[0] != expect[0]) or (expect[1] and got[1] != expect[1]):
            raise DataError(f"{repo}@{sha}: {rel} downloaded as {got[0]} bytes {got[1]}, the Hub says {expect[0]} "
                            f"bytes {expect[1]} ({where}): delete it from the HF cache and rerun")
        files[rel] = d
    return snap, files, sha


MARGIN = 1 << 30  # free space left after a download, for everything else on that disk


def _not_cached(repo: str, sha: str, meta: dict) -> int:
    """Bytes of ``meta``'s files the Hugging Face cache does not hold yet at ``sha`` (a rerun resumes)."""
    from huggingface_hub import try_to_load_from_cache

    return sum((s.size or 0) for rel, s in meta.items()
               if not isinstance(try_to_load_from_cache(repo, rel, revision=sha), str))


def _existing(path: str) -> str:
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return str(p)


def check_disk(what: str, download: int, local_root: str | None) -> None:
    """Refuse in one line, before downloading, a snapshot this machine's disks cannot hold: ``download`` bytes
    in the Hugging Face cache, plus (a local storage root) the snapshot's copy under the root, on whatever
    disk each is."""
    import shutil

    from huggingface_hub import constants

    places = [(constants.HF_HUB_CACHE, download, "the Hugging Face cache")]
    if local_root:
        places.append((local_root, download, "the storage root"))
    need: dict[int, list] = {}
    for path, size, name in places:
        where = _existing(path)
        dev = os.stat(where).st_dev
        need.setdefault(dev, [where, 0, []])
        need[dev][1] += size
        need[dev][2].append(f"{name} {path}")
    for where, size, names in need.values():
        free = shutil.disk_usage(where).free
        if size and size + MARGIN > free:
            raise DataError(f"{what}: needs {size / 1e9:.1f} GB (+{MARGIN / 1e9:.0f} GB spare) on the disk of "
                            f"{' and '.join(names)}, which has {free / 1e9:.1f} GB free: free space, or set HF_HOME "
                            "to a bigger disk; nothing was downloaded")


def _from_local(src: Path, where: str) -> tuple[Path, dict[str, dict]]:
    if not src.is_dir():
        raise DataError(f"{src}: not a directory holding an HF checkpoint ({where})")
    rels = sorted(p.relative_to(src).as_posix() for p in src.rglob("*")
                  if p.is_file() and wanted(p.relative_to(src).as_posix())
                  and not any(x.startswith(".") for x in p.relative_to(src).parts))
    _check_files(str(src), rels, where)
    return src, {rel: _digests(src / rel) for rel in rels}


def download_model(cfg: ModelConfig) -> dict:
    """The checkpoint of models/``cfg.name`` copied to its location, every file verified; the step's result."""
    where = "the student's hf_checkpoint / hf_revision"
    if cfg.local:
        src, files = _from_local(Path(cfg.local), where)
        source, commit = cfg.local, "local"
    else:
        local_root = None if io.is_remote(cfg.location) else cfg.location
        src, files, commit = _from_hub(cfg.ref, cfg.revision, where, local_root)
        source = f"{cfg.ref}@{commit}"
    log.info("copying %d verified files (%.2f GB) to %s", len(files), sum(f["size"] for f in files.values()) / 1e9,
             cfg.location)
    for rel, d in files.items():
        storage.copy_object(str(src / rel), io.join(cfg.location, rel), d)
    config = json.loads((src / "config.json").read_text())
    return {"source": source, "ref": cfg.ref, "revision": cfg.revision, "commit": commit,
            "files": {rel: {"size": d["size"], "sha256": d["sha256"]} for rel, d in files.items()},
            "bytes": sum(d["size"] for d in files.values()),
            "config": {k: config.get(k) for k in ARCHITECTURE_KEYS if k in config}}
