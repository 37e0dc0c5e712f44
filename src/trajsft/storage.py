"""Payloads under storage roots: sealed when built, found again, copied between roots and verified.

An artifact's name is what it is (a content hash); ``<storage_root>/<kind>/<name>/`` is only where its
payload lives. Every rule that builds a payload seals it last with ``payload.json``: each object's
relative path, size and md5, the step's result (paths in it relative to the location), and the
settings that are checked but not hashed (a download's ``rows``, a shard set's ``strict``). A payload
without a seal, or whose objects do not match it, is not finished (a write cut off mid-object, a
killed job, a copy in progress).

Before a rule builds a payload (:func:`build`), it looks for a sealed one with the same name: first at
its own location, then under the other roots this workdir has written to (``results/storage_roots.json``)
and the config's ``copy_from`` roots. One found elsewhere is copied object by object, each object's
md5 checked on the way and the destination's size and md5 checked afterwards, and sealed at its new
location; only if none verifies is the payload built. Snakemake reruns the rule when the root changes
(the location is in the rule's ``params``), so a manifest of another root is never taken as done.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import socket
import threading
import uuid
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

from . import gce, io
from .plan.kinds import KINDS

log = logging.getLogger("trajsft")

SEAL = "payload.json"
# top-level names that are no payload object: the seal itself, and the manifest (rewritten per root)
NOT_OBJECTS = {SEAL, "manifest.json"}
PLACEHOLDER = "@LOCATION@"
ROOTS_FILE = "storage_roots.json"
CHUNK = 8 << 20


class PayloadMismatch(Exception):
    """A payload's objects do not match its seal."""


def absolute(location: str) -> str:
    return location if io.is_remote(location) else os.path.abspath(location)


# ---- objects -----------------------------------------------------------------------------
def _md5_file(path: str) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def listing(location: str, *, hashes: bool = True) -> dict[str, dict]:
    """Every object under ``location``: relative path -> {size, md5 (hex)}. In a bucket the md5 is the
    one the server computed (no download); locally the file is read (``hashes=False``: sizes only)."""
    out: dict[str, dict] = {}
    loc = location.rstrip("/")
    if io.is_remote(loc):
        fs, path = io.fs_and_path(loc)
        with contextlib.suppress(FileNotFoundError):
            for p, info in fs.find(path, detail=True).items():
                rel = p[len(path.rstrip("/")) + 1:]
                md5 = info.get("md5Hash")
                out[rel] = {"size": int(info["size"]),
                            "md5": base64.b64decode(md5).hex() if md5 else None}
        for rel, meta in out.items():
            if meta["md5"] is None and hashes:  # a composite object has no md5: read it
                meta["md5"] = hashlib.md5(io.read_bytes(f"{loc}/{rel}")).hexdigest()
        return out
    for dirpath, _, files in os.walk(loc):
        for f in files:
            full = os.path.join(dirpath, f)
            rel = os.path.relpath(full, loc).replace(os.sep, "/")
            try:
                out[rel] = {"size": os.path.getsize(full), "md5": _md5_file(full) if hashes else None}
            except FileNotFoundError:  # a dangling link (W&B's latest-run links), or gone meanwhile
                continue
    return out


def objects(location: str, kind: str | None = None) -> dict[str, dict]:
    """The payload objects under ``location`` (for a training run: its weights only)."""
    only = KINDS[kind].sealed if kind in KINDS else None
    if only is None:
        return {k: v for k, v in listing(location).items() if k not in NOT_OBJECTS}
    return {f"{prefix}{k}": v for prefix in only for k, v in listing(io.join(location, prefix.rstrip("/"))).items()}


def mismatch(location: str, seal: dict) -> str | None:
    """Why the objects under ``location`` are not the sealed ones (None: every object there, same
    size and md5)."""
    have = objects(location, seal.get("kind"))
    for rel, want in sorted(seal["objects"].items()):
        got = have.get(rel)
        if got is None:
            return f"{rel} is missing"
        if got["size"] != want["size"]:
            return f"{rel} has {got['size']} bytes, sealed with {want['size']}"
        if got["md5"] != want["md5"]:
            return f"{rel} has md5 {got['md5']}, sealed with {want['md5']}"
    return None


# ---- seals ---------------------------------------------------------------------------------
def read_seal(location: str) -> dict | None:
    try:
        seal = io.read_json(io.join(location, SEAL))
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return seal if isinstance(seal, dict) and isinstance(seal.get("objects"), dict) else None


def unseal(location: str) -> None:
    """Remove the seal before a payload is (re)built there: a cut-off rebuild is never taken as finished."""
    p = io.join(location, SEAL)
    if io.is_remote(p):
        fs, path = io.fs_and_path(p)
        with contextlib.suppress(FileNotFoundError):
            fs.rm_file(path)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)


def _relocatable(result: dict, location: str) -> dict:
    text = json.dumps(result).replace(absolute(location), PLACEHOLDER)
    if not io.is_remote(location):
        text = text.replace(json.dumps(location)[:-1], '"' + PLACEHOLDER)  # the relative form, whole-string starts
    return json.loads(text)


def _located(result: dict, location: str) -> dict:
    return json.loads(json.dumps(result).replace(PLACEHOLDER, absolute(location)))


def seal(art, result: dict, checked: dict) -> dict:
    """Seal the payload just built at ``art.location`` (written last)."""
    s = {"kind": art.kind, "name": art.name, "hash": art.hash, "checked": checked,
         "objects": objects(art.location, art.kind), "result": _relocatable(result, art.location)}
    io.write_json(io.join(art.location, SEAL), s)
    return s


# ---- roots -----------------------------------------------------------------------------------
def _roots_file(plan) -> Path:
    return Path(plan.state_dir, ROOTS_FILE)


def known_roots(plan) -> list[str]:
    """Roots to look in, current first: the current root, the config's ``copy_from``, then every
    root this workdir has written to."""
    return roots_of(plan.root, plan.cfg.get("copy_from"), plan.state_dir)


def roots_of(root: str, copy_from: list[str] | None, state_dir: str) -> list[str]:
    """:func:`known_roots` of a workflow config's ``storage_root`` and ``copy_from`` and its local state dir."""
    roots = [absolute(root), *(absolute(r) for r in copy_from or [])]
    with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
        roots += json.loads(Path(state_dir, ROOTS_FILE).read_text())
    return list(dict.fromkeys(r.rstrip("/") for r in roots))


def remember_root(plan) -> None:
    """Add the current root to the workdir's list of roots written to (looked in by later runs)."""
    path = _roots_file(plan)
    try:
        roots = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        roots = []
    root = absolute(plan.root).rstrip("/")
    if root not in roots:
        io.write_json(path, [*roots, root])


STORAGE_HOSTS = {"gs": "storage.googleapis.com", "gcs": "storage.googleapis.com", "s3": "s3.amazonaws.com"}
_FSSPEC_PROTOCOL = {"gs": "gcs", "gcs": "gcs", "s3": "s3"}


def resolves(host: str, timeout_s: float) -> bool:
    """DNS lookup bounded in time (getaddrinfo itself has no timeout)."""
    out: list[bool] = []

    def work() -> None:
        try:
            socket.getaddrinfo(host, 443)
            out.append(True)
        except OSError:
            out.append(False)

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(timeout_s)
    return bool(out and out[0])


def custom_endpoint(storage_root: str) -> tuple[str, str] | None:
    """(endpoint URL, where it was set) when the root's client talks to another server than the cloud's:
    gcsfs honours ``STORAGE_EMULATOR_HOST`` and fsspec's ``endpoint_url`` setting for its protocol
    (``FSSPEC_GCS_ENDPOINT_URL``, ``FSSPEC_S3_ENDPOINT_URL`` or fsspec's config file)."""
    import fsspec.config

    scheme = storage_root.split("://", 1)[0]
    proto = _FSSPEC_PROTOCOL.get(scheme)
    if proto is None:
        return None
    url = (fsspec.config.conf.get(proto) or {}).get("endpoint_url")
    if url:
        return str(url), f"fsspec {proto}.endpoint_url"
    if proto == "gcs":
        emu = os.environ.get("STORAGE_EMULATOR_HOST", "")
        if emu not in ("", "default"):
            return (emu if emu.startswith(("http://", "https://")) else f"http://{emu}"), "STORAGE_EMULATOR_HOST"
    return None


def connects(url: str, timeout_s: float) -> str | None:
    """None if a TCP connection to ``url``'s host and port opens within ``timeout_s``, else why not."""
    u = urlsplit(url)
    try:
        port = u.port or (443 if u.scheme == "https" else 80)
        with socket.create_connection((u.hostname or "", port), timeout=timeout_s):
            return None
    except (OSError, ValueError) as e:
        return getattr(e, "strerror", None) or str(e) or type(e).__name__


def unreachable(root: str, timeout_s: float) -> str | None:
    """Why a bucket root's endpoint cannot be reached within ``timeout_s`` (its custom endpoint refuses a TCP
    connection, or the cloud's host name does not resolve), else None; a local root or an unknown scheme: None."""
    endpoint = custom_endpoint(root)
    if endpoint is not None:
        why = connects(endpoint[0], timeout_s)
        return f"cannot connect to {endpoint[0]} (set by {endpoint[1]}): {why}" if why else None
    host = STORAGE_HOSTS.get(root.split("://", 1)[0]) if io.is_remote(root) else None
    if host and not resolves(host, timeout_s):
        return f"cannot resolve {host} (no network, or DNS down)"
    return None


_REACHABLE: dict[str, bool] = {}
# a finished payload: its seal; a training run (not sealed: it resumes in place) has its done record
# (a bucket run dir) or its result file
FINISHED = {"checkpoints": ("done.json", "training_result.json")}


def reachable(root: str) -> bool:
    """A local root, or a bucket whose endpoint answers within 3 s (asked once per process): gcsfs
    would otherwise retry a dead endpoint for about a minute."""
    if not io.is_remote(root):
        return True
    if root not in _REACHABLE:
        _REACHABLE[root] = unreachable(root, 3.0) is None
    return _REACHABLE[root]


_REFUSED: dict[str, str] = {}  # root -> why it refused a read (401/403...): asked once per process


def refused(root: str) -> str | None:
    """Why ``root`` refused a read in this process (its bucket answered, but not to us), or None."""
    return _REFUSED.get(root)


def _refuse(root: str, e: Exception) -> None:
    _REFUSED[root] = " ".join(str(e).split())[:200] or type(e).__name__
    _REACHABLE[root] = False  # never asked again in this process: one refusal, not one per artifact


def note_refusal(root: str, e: Exception) -> None:
    """A read of ``root`` failed with ``e``: remembered as its refusal when it is one (not a missing object)."""
    if not isinstance(e, (FileNotFoundError, ValueError)):
        _refuse(root, e)


def unusable(root: str) -> str | None:
    """Why ``root`` cannot be read now, as the end of one line (None: it can, or it is local): its endpoint
    does not answer, or it refuses us. One look, never retried."""
    root = absolute(root)
    if not io.is_remote(root):
        return None
    if not reachable(root) and refused(root) is None:
        return "did not answer (no network, DNS or the endpoint down)"
    if refused(root) is None:
        try:
            io.exists(io.join(root, SEAL))
        except Exception as e:  # noqa: BLE001 - a bucket that refuses us (401/403): said, not raised
            _refuse(root, e)
    why = refused(root)
    return f"refused: {why}" if why else None


# ---- can the root be written? ---------------------------------------------------------------
def bucket_problem(storage_root: str, zone: str | None, location: str | None, location_type: str | None) -> str | None:
    """One line when a one-region bucket is not in the region of the profile's ``ray.zone`` (multi- and dual-region
    buckets pass: they are no one region's)."""
    if not zone or not location or (location_type or "").lower() != "region":
        return None
    if location.lower() == gce.region_of(zone):
        return None
    return (f"storage root {storage_root} is in {location} (its bucket's location), but this profile's cluster is in "
            f"{zone} (ray.zone): every read and checkpoint would cross regions; use a bucket in "
            f"{gce.region_of(zone)}, nothing was submitted")


def probe_write(storage_root: str, timeout_s: float = 20.0, zone: str | None = None) -> str | None:
    """Write and delete one small object under the root (a local root not made yet: in the directory it would be
    made in; nothing is created): None when it can be written, else one line why (a local root full, over quota or
    read-only is worded as a rule's write fault is, :func:`trajsft.io.fault_line`). A bucket
    is asked within ``timeout_s`` and, given a ``zone``, must be in its region (:func:`bucket_problem`)."""
    probe_name = f".trajsft-preflight-{uuid.uuid4().hex}"
    if not io.is_remote(storage_root) or storage_root.startswith("file://"):
        root = Path(storage_root.removeprefix("file://")).expanduser().absolute()
        here = root  # a root not made yet: where its first directory would be made (nothing is created)
        while not here.exists() and here != here.parent:
            here = here.parent
        if not here.is_dir():
            return f"storage root {storage_root} is not writable: {here} is not a directory"
        try:
            p = here / probe_name
            p.write_bytes(b"ok")
            p.unlink()
        except OSError as e:
            fault = io.write_fault(e)
            if fault:
                return io.fault_line(storage_root, fault[0])
            return f"storage root {storage_root} is not writable: {e.strerror or e}"
        return None
    # without this, gcsfs retries the failed connection with backoff for about a minute
    why = unreachable(storage_root, min(3.0, timeout_s))
    if why:
        return f"storage root {storage_root} unreachable: {why}"
    endpoint = custom_endpoint(storage_root)

    result: list[str | None] = []
    bucket = storage_root.split("://", 1)[1].split("/", 1)[0]

    def work() -> None:
        try:
            import fsspec

            fs, path = fsspec.core.url_to_fs(storage_root)
            target = path.rstrip("/") + "/" + probe_name
            fs.pipe_file(target, b"ok")
            with contextlib.suppress(FileNotFoundError):  # a retried delete the server had done (a dropped answer)
                fs.rm_file(target)
            if zone and storage_root.startswith("gs://"):
                meta = fs.call("GET", "b/{}", bucket, json_out=True)
                result.append(bucket_problem(storage_root, zone, meta.get("location"), meta.get("locationType")))
                return
            result.append(None)
        except FileNotFoundError:  # gcsfs: the upload URL answered 404
            where = endpoint[0] if endpoint else "the default endpoint"
            result.append(f"storage root {storage_root} is not writable: no bucket {bucket} at {where}")
        except Exception as e:  # noqa: BLE001 - report anything as a problem line
            result.append(f"storage root {storage_root} is not writable: {type(e).__name__}: {e}")

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(timeout_s)
    if not result:
        return f"storage root {storage_root}: write probe timed out after {timeout_s:g}s (credentials? `gcloud auth application-default login`)"
    return result[0]


def where(plan, art) -> list[str]:
    """The reachable roots holding a finished payload of ``art`` (sealed: the seal is read, the objects
    are not verified)."""
    return where_in(known_roots(plan), art)


def where_in(roots: list[str], art) -> list[str]:
    """:func:`where`, among ``roots``."""
    out = []
    for root in roots:
        if not reachable(root):
            continue
        loc = io.join(root, art.kind, art.name)
        try:
            if art.kind in FINISHED:
                found = any(io.exists(io.join(loc, f)) for f in FINISHED[art.kind])
            else:  # under its name, or an earlier one (rule jobs copy it to its name)
                found = read_seal(loc) is not None or any(read_seal(p) is not None
                                                          for p in earlier_names(root, art, loc))
        except Exception as e:  # noqa: BLE001 - a bucket that refuses us (401/403): said, not raised
            _refuse(root, e)
            continue
        if found:
            out.append(root)
    return out


# ---- copying ---------------------------------------------------------------------------------
def _stream(fi, fo, src: str, want: dict) -> None:
    h, n = hashlib.md5(), 0
    while chunk := fi.read(CHUNK):
        h.update(chunk)
        n += len(chunk)
        fo.write(chunk)
    if (n, h.hexdigest()) != (want["size"], want["md5"]):
        raise PayloadMismatch(f"{src}: {n} bytes md5 {h.hexdigest()}, sealed {want['size']} bytes md5 {want['md5']}")


def copy_object(src: str, dst: str, want: dict) -> None:
    """Stream one object; it is kept only if its bytes are the sealed ones (a bucket upload that fails
    is discarded, never finalised; a local file goes through a temp file)."""
    fs_src = io.filesystem(src)
    if not io.is_remote(dst):
        with io.atomic_path(dst) as tmp, fs_src.open(src, "rb") as fi, open(tmp, "wb") as fo:
            _stream(fi, fo, src, want)
        return
    fo = io.filesystem(dst).open(dst, "wb")
    try:
        with fs_src.open(src, "rb") as fi:
            _stream(fi, fo, src, want)
    except BaseException:
        with contextlib.suppress(Exception):
            fo.discard()
        fo.closed = True  # closing (also by the garbage collector) would upload what was buffered
        raise
    fo.close()


def copy_payload(src: str, dst: str, s: dict) -> None:
    """Copy a sealed payload and verify every object at ``dst``; seal it there last."""
    unseal(dst)
    for rel, want in sorted(s["objects"].items()):
        copy_object(f"{src.rstrip('/')}/{rel}", f"{dst.rstrip('/')}/{rel}", want)
    problem = mismatch(dst, s)
    if problem:
        raise PayloadMismatch(f"copy at {dst}: {problem}")
    io.write_json(io.join(dst, SEAL), {**s, "copied_from": src})


# ---- the rule layer ----------------------------------------------------------------------------
def earlier_names(root: str, art, own: str) -> list[str]:
    """The payload locations under ``root`` of ``art``'s kind and hash but another name: the same content as an
    earlier release named it (raw, shards and tokenized were named by their teacher entry, ``<teacher>-<hash>``,
    before they were named by their dataset). A root that cannot be listed has none."""
    try:
        found = io.glob(io.join(root, art.kind, f"*-{art.hash}"))
    except Exception:  # noqa: BLE001 - a root we cannot list (offline, refused): its own name is still tried
        return []
    return [p.rstrip("/") for p in found if p.rstrip("/") != own.rstrip("/")]


def find(plan, art, checked: dict, *, here_too: bool = True) -> tuple[dict, str] | None:
    """A verified payload of ``art`` at its location, copied there from another root if need be:
    (the step's result at ``art.location``, where it came from), or None (build it).
    ``here_too=False``: only look under the other roots."""
    here = absolute(art.location).rstrip("/")

    def candidates():  # each root: the artifact's own name, then (listed only if need be) its earlier names
        for root in known_roots(plan):
            if root == absolute(plan.root).rstrip("/") and not here_too:
                continue
            own = here if root == absolute(plan.root).rstrip("/") else io.join(root, art.kind, art.name)
            yield own
            yield from earlier_names(root, art, own)

    for loc in candidates():
        s = read_seal(loc)
        if s is None or s.get("hash") != art.hash or s.get("checked") != checked:
            continue
        try:
            if loc == here:
                problem = mismatch(loc, s)
                if problem:
                    log.warning("%s/%s at %s does not match its seal (%s): not reused", art.kind, art.name, loc, problem)
                    continue
                log.info("%s/%s: the sealed payload at %s verifies (%d objects): reused", art.kind, art.name, loc,
                         len(s["objects"]))
            else:
                log.info("%s/%s: copying the sealed payload from %s to %s (%d objects)", art.kind, art.name, loc,
                         here, len(s["objects"]))
                copy_payload(loc, art.location, s)
        except (PayloadMismatch, OSError) as e:
            log.warning("%s/%s: the payload at %s is not usable: %s", art.kind, art.name, loc, e)
            continue
        return _located(s["result"], art.location), loc
    return None


def build(plan, art, make: Callable[[], dict]) -> dict:
    """The step's result for ``art``: a verified payload found (here or under another root) or
    ``make()`` run, its payload then sealed. The result says where it came from (``payload_from``)."""
    checked = KINDS[art.kind].checked_settings(art.spec)
    found = find(plan, art, checked)
    if found is not None:
        result, origin = found
    else:
        unseal(art.location)
        result, origin = make(), "built"
        seal(art, result, checked)
    remember_root(plan)
    return {**result, "payload_from": origin}


def train(plan, art, run: Callable[[], dict]) -> dict:
    """A training run: unless its weights are sealed here, sealed weights under another root are copied
    (verified) first, so that ``run()`` finds the final checkpoint and does not train again; the
    weights of a successful run are sealed."""
    if read_seal(art.location) is None:
        found = find(plan, art, {}, here_too=False)
        if found is not None:
            log.info("%s: trained weights copied from %s", art.name, found[1])
    result = run()
    if read_seal(art.location) is None:
        seal(art, {}, {})
    remember_root(plan)
    return result
