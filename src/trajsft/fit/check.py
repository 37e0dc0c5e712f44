"""``trajsft fit``: does a target's train step fit the profile's TPU slice, and what will the run cost?

The check compiles the train rule's own step (:mod:`trajsft.fit.compile`, a child process: the only part
that imports jax/Levanter) for the slice's topology with libtpu's compiler on this machine, and turns the
compiler's memory analysis into the figures a user decides on: HBM per chip used and limit, model FLOPs
per step, estimated step time at an assumed MFU, the run's wall hours and chip-hours.

The result is an artifact like the others: ``results/fit/<target>/<tpu_type>-<hash>.json``, content-
addressed by the run's hash inputs (so everything the step is built from), the slice, the attention kernel,
this module's format and the jax/jaxlib/libtpu/levanter versions; a second call reads it back. The step
count and the data's non-pad share are read from the plan and the tokenized manifests when known and are
not part of the key (they change the estimate, not the compile).
"""

from __future__ import annotations

import copy
import fcntl
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .. import io
from ..errors import DataError
from ..plan import hashing
from ..plan.step_configs import TrainConfig
from ..train import remat
from . import facts, flops, slices

log = logging.getLogger("trajsft")
# what a compile is doing, while it runs (minutes for an 8B model): `trajsft fit` shows it on the terminal, a rule job
# in its log
progress = logging.getLogger("trajsft.progress")
COMPILE_NOTE_S = 30.0  # a "still compiling" line at most this often

FORMAT = 2  # bump when the compiled step or the figures change meaning (invalidates cached results)
TPU_ATTENTION = "SPLASH"  # what Levanter's default_attention_type() picks on a TPU
# Assumed model-FLOPs utilisation of the estimate (--mfu overrides). Levanter logs throughput/mfu with the
# same FLOP count (lm_flops_per_token, full attention); dense decoder training with FSDP on TPU v4/v5p is
# commonly reported at 35-50% MFU at long sequence lengths; 0.4 sits in that range. Replace it with the
# throughput/mfu your run logs after its first steps.
DEFAULT_MFU = 0.4
# training.remat auto: the least recompute whose step leaves this share of the chip's HBM free (the compiler's
# figure is a plan; fragmentation and runtime buffers come on top)
HBM_MARGIN = 0.10
GIB = 2**30
VERSIONED = ("jax", "jaxlib", "libtpu", "levanter")
_HBM_RE = re.compile(r"Used ([\d.]+)([KMGT])? of ([\d.]+)([KMGT])? hbm", re.I)
_UNITS = {None: 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


class LibtpuMissing(DataError):
    """libtpu is not installed: the check cannot compile."""


def versions() -> dict:
    from ..runtime.provenance import package_versions

    return package_versions(VERSIONED)


def require_libtpu() -> dict:
    v = versions()
    if not v["libtpu"]:
        raise LibtpuMissing("libtpu is not installed, so the TPU compiler cannot run here: "
                            "uv sync --locked (the tpu group of the lock) installs it")
    return v


@dataclass(frozen=True)
class Setting:
    """What one compile is of: the target's step on a slice, with an optional batch size override, under a remat
    policy (:mod:`trajsft.train.remat`)."""

    target: str
    tpu_type: str
    batch_size: int
    remat: str = remat.DEFAULT


def tpu_type_of(cfg: TrainConfig, override: Optional[str] = None) -> str:
    t = override or ((cfg.workflow.get("ray") or {}).get("tpu_type"))
    if not t:
        raise DataError("fit needs a TPU slice: use a TPU profile (--profile tpu-east5) or --tpu-type v5p-32")
    slices.parse(t)
    return t


def vocab_size(cfg: TrainConfig) -> int:
    """``len(tokenizer)`` as ``train_lm`` computes it: from a local tokenizer dir, else the student's
    ``vocab_size`` fact in the config (a Hub tokenizer is not downloaded for the check)."""
    st = cfg.spec.student
    if st.tokenizer.local is not None:
        tj = os.path.join(st.tokenizer.local, "tokenizer.json")
        if os.path.exists(tj):  # len(tokenizer) of a fast tokenizer, without importing transformers
            from tokenizers import Tokenizer

            return Tokenizer.from_file(tj).get_vocab_size(with_added_tokens=True)
        from transformers import AutoTokenizer

        return len(AutoTokenizer.from_pretrained(st.tokenizer.local))
    if st.vocab_size:
        return int(st.vocab_size)
    raise DataError(f"students.{st.name}: give vocab_size (len of tokenizer {st.tokenizer.hub_ref()}): "
                    "the fit check does not download the tokenizer")


def levanter_request(cfg: TrainConfig, setting: Setting, lev: dict) -> dict:
    """The compile request: the train rule's train_lm config ``lev`` for a TPU (``accelerator: tpu``; from
    :func:`trajsft.train.target.train_lm_config_for`) at the setting's batch size, and the slice."""
    lev = copy.deepcopy(lev)
    lev["trainer"]["train_batch_size"] = int(setting.batch_size)
    lev["model"]["gradient_checkpointing"] = remat.levanter_value(setting.remat)
    sl = slices.parse(setting.tpu_type)
    return {"levanter": lev, "topology": sl.topology, "vocab_size": vocab_size(cfg),
            "attn_backend": TPU_ATTENTION}


def key(cfg: TrainConfig, setting: Setting, v: dict) -> str:
    run = cfg.run
    policy = {} if setting.remat == remat.DEFAULT else {"remat": setting.remat}  # full: the keys of before
    return hashing.short({"format": FORMAT, "run": run.inputs, "tpu_type": setting.tpu_type,
                          "topology": slices.parse(setting.tpu_type).topology, "batch_size": setting.batch_size,
                          "attn_backend": TPU_ATTENTION, "versions": v, **policy})


def result_path(cfg: TrainConfig, setting: Setting, v: dict) -> Path:
    suffix = "" if setting.batch_size == _batch(cfg) else f"-b{setting.batch_size}"
    suffix += "" if setting.remat == remat.DEFAULT else f"-{setting.remat}"
    return Path(cfg.results, "fit", setting.target, f"{setting.tpu_type}{suffix}-{key(cfg, setting, v)}.json")


def _batch(cfg: TrainConfig) -> int:
    return int(cfg.spec.training.batch_size)


def cached(cfg: TrainConfig, tpu_type: Optional[str] = None, policy: str = remat.DEFAULT) -> Optional[dict]:
    """The cached compile of a target's own settings on its slice under ``policy``, or None (no compile, no libtpu
    needed)."""
    try:
        setting = Setting(cfg.target, tpu_type_of(cfg, tpu_type), _batch(cfg), policy)
        path = result_path(cfg, setting, versions())
    except (DataError, ValueError):
        return None
    return _read(path) or _read(shared_cache(path.stem))


def cached_summary(cfg: TrainConfig, steps: Optional[int], tpu_type: Optional[str] = None) -> Optional[dict]:
    """The summary of the cached compile of a target on its slice under its remat policy (auto: the policy the
    cached candidates give; None: not checked yet, or no slice); ``steps``: the run's step count when known
    (``trajsft.train.target.explain``)."""
    policy = cfg.spec.training.remat
    found = []
    for p in (remat.POLICIES if policy == remat.AUTO else (policy,)):
        raw = cached(cfg, tpu_type, p)
        if raw is None:
            return None
        raw["cached"] = True
        found.append(summarize(cfg, raw, steps))
    return found[0] if policy != remat.AUTO else choose(found)


def short(s: Optional[dict], tpu_type: Optional[str] = None) -> str:
    """One line for ``plan --explain`` and ``status``."""
    if s is None:
        return (f"fit on {tpu_type}: not checked yet (trajsft fit)" if tpu_type else
                "fit: no TPU slice in this profile (trajsft fit --tpu-type v5p-32)")
    if not s["fits"]:
        used = "?" if s.get("hbm_used_gib") is None else f"{s['hbm_used_gib']:.2f}"
        return f"fit on {s['tpu_type']}: DOES NOT FIT ({used} of {s['hbm_limit_gib']:.2f} GiB HBM per chip)"
    hours = "" if s["slice_wall_hours"] is None else (
        f", est. {s['slice_wall_hours']:.1f} h on the slice / {s['chip_hours']:.0f} chip-hours at "
        f"{s['mfu_assumed']:.0%} MFU")
    policy = s.get("remat", remat.DEFAULT) + (" (auto)" if s.get("remat_auto") else "")
    return (f"fit on {s['tpu_type']}: {s['hbm_used_gib']:.2f} of {s['hbm_limit_gib']:.2f} GiB HBM per chip, "
            f"remat {policy}{hours}")


def shared_cache(k: str) -> Path:
    """The machine-wide copy of a compile result (``$TRAJSFT_FIT_CACHE``, default ``~/.cache/trajsft/fit``): the
    key covers everything the compile depends on, so every checkout and workdir of this machine shares it."""
    root = os.environ.get("TRAJSFT_FIT_CACHE") or io.cache_root() / "fit"
    return Path(root, f"{k}.json")


def _read(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def compile_setting(cfg: TrainConfig, setting: Setting, lev: dict, *, log_path: Optional[Path] = None) -> dict:
    """The compiler's figures for one setting: read from the cache, else compiled in a child and cached."""
    v = require_libtpu()
    path = result_path(cfg, setting, v)
    shared = shared_cache(path.stem)
    out = _cached_copy(path, shared)
    if out is not None:
        return out
    # one compile of a setting at a time on this machine (two check_fit jobs, two test workers): the others wait
    # for it, then read its result
    shared.parent.mkdir(parents=True, exist_ok=True)
    with open(shared.parent / f".{shared.stem}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        out = _cached_copy(path, shared)
        if out is not None:
            return out
        return _compile(cfg, setting, lev, path, shared, log_path)


def _cached_copy(path: Path, shared: Path) -> Optional[dict]:
    """The cached result of a setting (the run's copy, else the machine's, copied to the run), or None."""
    for src in (path, shared):
        out = _read(src)
        if out is not None:
            if src is shared:
                io.write_json(path, out)
            out["cached"] = True
            return out
    return None


def _compile(cfg: TrainConfig, setting: Setting, lev: dict, path: Path, shared: Path,
             log_path: Optional[Path]) -> dict:
    req = levanter_request(cfg, setting, lev)
    path.parent.mkdir(parents=True, exist_ok=True)
    log_path = log_path or path.with_suffix(".log")
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="trajsft-fit-") as tmp:
        req_path, out_path = os.path.join(tmp, "request.json"), os.path.join(tmp, "result.json")
        Path(req_path).write_text(json.dumps(req))
        # the compiler needs no TPU and must not look for one: JAX itself stays on the CPU
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "TPU_SKIP_MDS_QUERY": "1", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
        what = f"{setting.target}'s train step for {setting.tpu_type} (remat {setting.remat}, batch {setting.batch_size})"
        progress.info("fit: compiling %s with libtpu", what)
        with open(log_path, "ab") as logf:
            proc = subprocess.Popen([sys.executable, "-m", "trajsft.fit.compile", req_path, out_path],
                                    stdout=logf, stderr=subprocess.STDOUT, env=env)
            try:
                while True:
                    try:
                        proc.wait(timeout=COMPILE_NOTE_S)
                        break
                    except subprocess.TimeoutExpired:
                        progress.info("fit: still compiling %s: %d s", what, time.time() - t0)
            finally:
                if proc.poll() is None:  # we were stopped (Ctrl-C): so is the compile
                    proc.kill()
                    proc.wait()
        progress.info("fit: compiled %s in %d s", what, time.time() - t0)
        if proc.returncode != 0 or not os.path.exists(out_path):
            raise DataError(f"fit: the compile process of {setting.target} on {setting.tpu_type} exited "
                            f"{proc.returncode} (log: {log_path})")
        raw = json.loads(Path(out_path).read_text())
    raw.update(tpu_type=setting.tpu_type, batch_size=setting.batch_size, topology=req["topology"],
               vocab_size=req["vocab_size"], wall_seconds=round(time.time() - t0, 1), key=path.stem,
               remat=setting.remat)
    io.write_json(path, raw)
    io.write_json(shared, raw)
    raw["cached"] = False
    return raw


# --------------------------------------------------------------------------- figures


def _hbm_from_error(msg: str) -> tuple[Optional[int], Optional[int]]:
    m = _HBM_RE.search(msg)
    if not m:
        return None, None
    return int(float(m.group(1)) * _UNITS[m.group(2)]), int(float(m.group(3)) * _UNITS[m.group(4)])


def fits(raw: dict, sl: slices.Slice) -> bool:
    return bool(raw.get("ok")) and raw["hbm_per_chip"]["peak_bytes"] <= sl.hbm_bytes_per_device


def data_stats(cfg: TrainConfig) -> dict:
    """Non-pad share of the packed sequences (weighted by the target's teachers), when tokenized."""
    spec = cfg.run.spec
    share, known = 0.0, True
    for teacher, tok in cfg.tokenized.items():
        try:
            tr = (tok.read_manifest().get("stats") or {}).get("train") or {}
        except DataError:
            known = False
            continue
        if tr.get("packed_non_pad") is None:
            known = False
            continue
        share += float(spec["weights"][teacher]) * float(tr["packed_non_pad"])
    return {"non_pad_share": share if known else None}


def summarize(cfg: TrainConfig, raw: dict, steps: Optional[int] = None, mfu: float = DEFAULT_MFU) -> dict:
    """The user's figures of one compile: fit, HBM, FLOPs, time and, with ``steps``, the cost of the whole run."""
    sl = slices.parse(raw["tpu_type"])
    ts = cfg.spec
    dims = ts.student.model.dims()
    seq, batch = int(ts.training.seq_len), int(raw["batch_size"])
    tokens = seq * batch
    out: dict = {"target": cfg.target, "run": cfg.run.name, "tpu_type": sl.tpu_type,
                 "topology": sl.topology, "devices": sl.devices, "hosts": sl.hosts, "batch_size": batch,
                 "seq_len": seq, "fits": fits(raw, sl), "compiled": bool(raw.get("ok"))}
    limit = sl.hbm_bytes_per_device
    if raw.get("ok"):
        h = raw["hbm_per_chip"]
        out.update(devices=raw["devices"], hbm_used_gib=round(h["peak_bytes"] / GIB, 2),
                   hbm_limit_gib=round(limit / GIB, 2), hbm_params_gib=round(h["params_bytes"] / GIB, 2),
                   hbm_optimizer_state_gib=round(h["optimizer_state_bytes"] / GIB, 2),
                   hbm_temporaries_gib=round(h["temporaries_bytes"] / GIB, 2),
                   hbm_arguments_gib=round(h["arguments_bytes"] / GIB, 2), params=raw["params"],
                   mesh=raw["mesh"], attn_backend=raw["attn_backend"],
                   attention_forward_kernels=raw.get("attention_forward_kernels"))
    else:
        used, lim = _hbm_from_error(raw.get("error", ""))
        out.update(hbm_used_gib=None if used is None else round(used / GIB, 2),
                   hbm_limit_gib=round((lim or limit) / GIB, 2), error=_first_line(raw.get("error", "")))
    vocab = int(raw["vocab_size"])
    fpt_lev = raw.get("levanter_flops_per_token") or flops.train_flops_per_token(dims, vocab, seq, False) / 3
    step_flops = 3.0 * fpt_lev * tokens
    out.update(tokens_per_step=tokens, model_flops_per_step=step_flops,
               flops_count="levanter lm_flops_per_token x 3 (full attention, as its throughput/mfu)",
               model_flops_per_step_causal=flops.train_flops_per_token(dims, vocab, seq, True) * tokens,
               xla_flops_per_device_scan_body_once=raw.get("xla_flops_per_device"))
    stats = data_stats(cfg)
    out["non_pad_tokens_per_step"] = None if stats["non_pad_share"] is None else round(tokens * stats["non_pad_share"])
    # the assumed MFU is full remat's (model FLOPs over time, recomputation not counted): a policy that recomputes
    # less takes its share of that time
    policy = raw.get("remat", remat.DEFAULT)
    r_full = flops.remat_factor(dims, vocab, seq, recompute_attention=True)
    r = flops.remat_factor(dims, vocab, seq, recompute_attention=remat.RECOMPUTES_ATTENTION[policy])
    step_s = step_flops / (sl.peak_flops * mfu) * r / r_full
    steps = steps if batch == _batch(cfg) else None  # another batch: another step count
    out.update(remat=policy, recompute_vs_no_remat=round(r, 3), recompute_vs_full=round(r / r_full, 3),
               mfu_assumed=mfu, peak_bf16_flops_per_chip=sl.family.peak_bf16_flops, step_seconds_estimate=step_s,
               steps=steps)
    if steps is not None:
        wall = steps * step_s / 3600
        out.update(slice_wall_hours=round(wall, 2), chip_hours=round(wall * sl.chips, 1),
                   tpu_core_hours=round(wall * sl.chips * sl.family.cores_per_chip, 1))
    else:
        out.update(slice_wall_hours=None, chip_hours=None, tpu_core_hours=None)
    out.update(compile_seconds=raw.get("compile_seconds"), compile_peak_rss_gib=(
        None if raw.get("peak_rss_bytes") is None else round(raw["peak_rss_bytes"] / GIB, 2)),
        versions=raw.get("versions"), cached=raw.get("cached", False), key=raw.get("key"))
    return out


def _first_line(msg: str) -> str:
    m = _HBM_RE.search(msg)
    if m:
        return " ".join(msg[max(0, m.start() - 40):m.end() + 60].split())
    return " ".join((msg.strip().splitlines() or [""])[0].split())[:300]


def refusal(s: dict, suggestion: Optional[dict] = None) -> str:
    """The one line of a step that does not fit (or does not compile), naming the knobs."""
    where = f"{s['target']} on {s['tpu_type']} ({s['devices']} chips)"
    policy = (f"training.remat auto: no policy fits, {s['remat']} shown" if s.get("remat_auto")
              else f"training.remat {s.get('remat', remat.DEFAULT)}")
    knobs = (f"training.batch_size {s['batch_size']}, training.seq_len {s['seq_len']}, ray.tpu_type {s['tpu_type']}, "
             f"{policy}")
    if not s["compiled"] and s.get("hbm_used_gib") is None:
        return f"{where}: the train step does not compile: {s.get('error')} ({knobs})"
    used = "?" if s.get("hbm_used_gib") is None else f"{s['hbm_used_gib']:.2f}"
    line = (f"{where} does not fit: the train step needs {used} GiB of HBM per chip, the chip has "
            f"{s['hbm_limit_gib']:.2f} GiB ({knobs})")
    if suggestion:
        alts = []
        if suggestion.get("batch_size"):
            alts.append(f"training.batch_size {suggestion['batch_size']} fits "
                        f"({suggestion['batch_hbm_used_gib']:.2f} GiB)")
        if suggestion.get("tpu_type"):
            alts.append(f"ray.tpu_type {suggestion['tpu_type']} fits ({suggestion['slice_hbm_used_gib']:.2f} GiB)")
        tried = ", ".join(suggestion.get("tried") or []) or "nothing"
        line += "; " + (" or ".join(alts) if alts else
                        f"no halved batch (at least one sequence per chip) or larger slice (its chips dividing the "
                        f"batch) fits (tried: {tried}): lower training.seq_len or the model, or raise both "
                        f"batch_size and tpu_type")
    return line


def suggest(cfg: TrainConfig, s: dict, lev: dict, *, max_compiles: int = 3) -> dict:
    """What would fit, in a few bounded compiles: the largest halved batch that still gives every chip a
    sequence, else the smallest of the next two larger slices of the family whose chips divide the batch
    (Levanter shards the batch over every chip; a slice that cannot take it is skipped without compiling)."""
    out: dict = {"tried": []}
    sl = slices.parse(s["tpu_type"])
    budget = max_compiles
    b = s["batch_size"] // 2
    while budget > 0 and b >= sl.devices and b % sl.devices == 0:
        budget -= 1
        r = summarize(cfg, compile_setting(cfg, Setting(cfg.target, s["tpu_type"], b, s["remat"]), lev))
        out["tried"].append(f"batch_size {b}")
        if r["fits"]:
            out.update(batch_size=b, batch_hbm_used_gib=r["hbm_used_gib"])
            return out
        b //= 2
    for bigger in slices.bigger(s["tpu_type"])[:2]:
        if budget <= 0:
            break
        if s["batch_size"] % slices.parse(bigger).devices:
            continue
        budget -= 1
        r = summarize(cfg, compile_setting(cfg, Setting(cfg.target, bigger, s["batch_size"], s["remat"]), lev))
        out["tried"].append(bigger)
        if r["fits"]:
            out.update(tpu_type=bigger, slice_hbm_used_gib=r["hbm_used_gib"])
            return out
    return out


def choose(candidates: list[dict]) -> dict:
    """training.remat auto: of the policies' summaries (``skipped``: the compiler rejected or crashed on it), the
    least recompute that fits with HBM_MARGIN of the chip's HBM free (at equal recompute, the earlier of
    remat.POLICIES: no host traffic), else the least recompute that fits at all, else full's refusal; with
    ``remat_auto``: the choice, why, and every candidate in one row."""
    compiled = [c for c in candidates if not c.get("skipped")]
    fit = [c for c in compiled if c["fits"]]
    roomy = [c for c in fit if c["hbm_used_gib"] <= (1 - HBM_MARGIN) * c["hbm_limit_gib"]]
    rank = (lambda c: (c["recompute_vs_full"], remat.POLICIES.index(c["remat"])))
    if roomy:
        pick, why = min(roomy, key=rank), f"the least recompute that fits with {HBM_MARGIN:.0%} of HBM free"
    elif fit:
        pick, why = min(fit, key=rank), f"none fits with {HBM_MARGIN:.0%} of HBM free: the least recompute that fits"
    elif compiled:
        pick = next((c for c in compiled if c["remat"] == remat.DEFAULT), compiled[0])
        why = "no policy fits"
    else:
        raise DataError("fit: no remat policy compiled: " + "; ".join(f"{c['remat']}: {c['skipped']}"
                                                                      for c in candidates))
    rows = [{"remat": c["remat"], "skipped": c["skipped"]} if c.get("skipped") else
            {k: c.get(k) for k in ("remat", "fits", "hbm_used_gib", "hbm_limit_gib", "recompute_vs_no_remat",
                                   "recompute_vs_full", "step_seconds_estimate", "chip_hours", "cached")}
            for c in candidates]
    return {**pick, "remat_auto": {"chosen": pick["remat"], "why": why, "margin": HBM_MARGIN, "candidates": rows}}


def _policy_summary(cfg: TrainConfig, setting: Setting, lev: dict, steps: Optional[int], mfu: float) -> dict:
    """One policy's summary for auto, or ``{"remat", "skipped"}`` when its compile crashes or errs (one line)."""
    try:
        s = summarize(cfg, compile_setting(cfg, setting, lev), steps, mfu)
    except DataError as e:
        log.warning("fit: training.remat %s skipped: %s", setting.remat, e)
        return {"remat": setting.remat, "skipped": str(e)}
    if not s["compiled"] and s.get("hbm_used_gib") is None:  # an error, not the HBM refusal
        log.warning("fit: training.remat %s skipped: %s", setting.remat, s.get("error"))
        return {"remat": setting.remat, "skipped": s.get("error")}
    return s


def check(cfg: TrainConfig, lev: dict, steps: Optional[int], *, tpu_type: Optional[str] = None,
          mfu: Optional[float] = None, suggest_on_failure: bool = True, policy: Optional[str] = None) -> dict:
    """Compile (or read back) the target's step on its slice; the summary, with ``suggestion`` when it does not fit.

    ``lev``: the target's train_lm config for a TPU (:func:`trajsft.train.target.train_lm_config_for` with
    ``accelerator="tpu"``), ``steps`` its step count when known: the caller's, so this module never imports the
    train step (which imports the Ray submission, which runs this check). ``policy``: training.remat (default:
    the target's); ``auto`` compiles every policy and picks one (:func:`choose`)."""
    mfu = DEFAULT_MFU if mfu is None else float(mfu)
    if not 0 < mfu <= 1:
        raise ValueError(f"--mfu {mfu}: a fraction in (0, 1]")
    t = tpu_type_of(cfg, tpu_type)
    policy = policy or cfg.spec.training.remat
    if policy not in remat.CHOICES:
        raise ValueError(f"training.remat {policy!r}: one of {', '.join(remat.CHOICES)}")
    hf_check = facts.check(cfg.spec.student, snapshot=cfg.model and cfg.model.location)
    if policy == remat.AUTO:
        s = choose([_policy_summary(cfg, Setting(cfg.target, t, _batch(cfg), p), lev, steps, mfu)
                    for p in remat.POLICIES])
    else:
        s = summarize(cfg, compile_setting(cfg, Setting(cfg.target, t, _batch(cfg), policy), lev), steps, mfu)
    s["hf_config_check"] = hf_check
    if not s["fits"] and suggest_on_failure and s.get("hbm_used_gib") is not None:
        s["suggestion"] = suggest(cfg, s, lev)
    return s


def render(s: dict) -> list[str]:
    """Human-readable lines of one summary."""
    head = f"{s['target']} on {s['tpu_type']} ({s['topology']}, {s['devices']} chips, {s['hosts']} hosts)"
    auto = _render_auto(s.get("remat_auto"))
    if not s["fits"]:
        return [head + ": DOES NOT FIT", "  " + refusal(s, s.get("suggestion")), *auto]
    lines = [head + f": fits, {s['hbm_used_gib']:.2f} of {s['hbm_limit_gib']:.2f} GiB HBM per chip",
             f"  model: {s['params'] / 1e9:.2f}B parameters; architecture facts: {s.get('hf_config_check', '-')}",
             f"  per chip: params {s['hbm_params_gib']:.2f} GiB + optimizer state {s['hbm_optimizer_state_gib']:.2f} GiB"
             f" (arguments {s['hbm_arguments_gib']:.2f}) + temporaries {s['hbm_temporaries_gib']:.2f} GiB "
             f"(activations; {s['attn_backend']} attention, mesh {s['mesh']})",
             f"  step: batch {s['batch_size']} x seq_len {s['seq_len']} = {s['tokens_per_step']:,} tokens"
             + ("" if s["non_pad_tokens_per_step"] is None else f" ({s['non_pad_tokens_per_step']:,} non-pad)")
             + f", {s['model_flops_per_step']:.3e} model FLOPs ({s['flops_count']}; causal count "
               f"{s['model_flops_per_step_causal']:.3e})",
             f"  estimate at {s['mfu_assumed']:.0%} MFU of {s['peak_bf16_flops_per_chip'] / 1e12:.0f} TFLOP/s per chip: "
             f"{s['step_seconds_estimate']:.1f} s/step"]
    if s["steps"] is not None:
        lines.append(f"  run: {s['steps']} steps = {s['slice_wall_hours']:.1f} h on the slice, "
                     f"{s['chip_hours']:.0f} chip-hours ({s['tpu_core_hours']:.0f} TPU core-hours)")
    else:
        lines.append("  run: step count known once the data is tokenized")
    lines.append(f"  remat {s['remat']}: the backward pass costs {s['recompute_vs_no_remat']:.2f}x the FLOPs of a step "
                 f"without remat, {s['recompute_vs_full']:.2f}x full remat's (on paper; the estimate above counts it)")
    lines.extend(auto)
    lines.append(f"  compiled in {s['compile_seconds']} s" + (" (cached)" if s["cached"] else "")
                 + f"; jax {s['versions']['jax']}, libtpu {s['versions']['libtpu']}")
    return lines


def _render_auto(auto: Optional[dict]) -> list[str]:
    """training.remat auto: the choice and one line per candidate policy."""
    if not auto:
        return []
    lines = [f"  training.remat auto chose {auto['chosen']}: {auto['why']}"]
    for c in auto["candidates"]:
        if c.get("skipped"):
            lines.append(f"    {c['remat']:<16} skipped: {_first_line(str(c['skipped']))}")
            continue
        used = "?" if c["hbm_used_gib"] is None else f"{c['hbm_used_gib']:.2f}"
        cost = "" if c["chip_hours"] is None else f", {c['chip_hours']:.0f} chip-hours"
        lines.append(f"    {c['remat']:<16} {'fits' if c['fits'] else 'does not fit':<12} {used:>7} GiB HBM/chip, "
                     f"recompute {c['recompute_vs_no_remat']:.2f}x, {c['step_seconds_estimate']:.1f} s/step{cost}")
    return lines
