"""HF (safetensors) export of a trainer checkpoint with Levanter's converter, in a child process."""

from __future__ import annotations

if __name__ == "__main__":  # the child process export_hf launches
    from .launch import child_prelude

    child_prelude()

import contextlib
import datetime as _dt
import json
import os
import shutil
import sys
import uuid
from typing import Mapping, Optional

from ..errors import TrainingFailed
from .launch import EXPORT_CHILD, exit_reason, run_subprocess, levanter_env
from .metrics import LAUNCH_MARK
from ..io import is_remote, read_json, write_json
from .levanter_config import plain_data, resolve_hub_refs, write_config


def chat_template_of(cfg: dict) -> Optional[str]:
    data = cfg["data"]
    if data.get("chat_template"):
        return data["chat_template"]
    fmts = [e.get("format", {}) for e in (data["configs"].values() if "configs" in data else [data])]
    for f in fmts:
        if f.get("chat_template"):
            return f["chat_template"]
    return None


def write_chat_template(export_dir: str, template: str) -> None:
    """Make the export's tokenizer carry the template we trained with (Levanter saves the base
    tokenizer's own template)."""
    with open(os.path.join(export_dir, "chat_template.jinja"), "w") as f:
        f.write(template)
    tc = os.path.join(export_dir, "tokenizer_config.json")
    if os.path.exists(tc):
        conf = read_json(tc)
        if "chat_template" in conf:  # older layout: template inline; keep both consistent
            conf["chat_template"] = template
            write_json(tc, conf, indent=1, sort_keys=False, end="")


def export_hf(
    config_dict: Mapping,
    checkpoint_path: str,
    output_dir: str,
    *,
    env: Optional[Mapping[str, str]] = None,
    log_path: Optional[str] = None,
    cwd: Optional[str] = None,
) -> str:
    """Export a trainer checkpoint to an HF checkpoint with Levanter's converter
    (``HFCheckpointConverter.save_pretrained``, as the in-training hook does), in a subprocess.

    The model / tokenizer / reference / dtype come from the same train_lm config, so the export
    matches what the ``hf_save_path`` hook would have written. Written to a temporary sibling and
    renamed into place (local paths)."""
    cfg = resolve_hub_refs(plain_data(config_dict))
    work = cwd or os.path.dirname(os.path.abspath(output_dir))
    os.makedirs(work, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    spec_path = os.path.join(work, f".export-{tag}.json")
    cfg_path = write_config(cfg, os.path.join(work, f".export-{tag}.yaml"))
    remote = is_remote(output_dir)
    tmp_out = output_dir if remote else os.path.join(
        os.path.dirname(os.path.abspath(output_dir)), f".{os.path.basename(output_dir)}.exporting-{os.getpid()}"
    )
    with open(spec_path, "w") as f:
        json.dump({"config_path": cfg_path, "checkpoint_path": checkpoint_path, "output_dir": tmp_out}, f)
    try:
        cmd = [*EXPORT_CHILD, spec_path]
        rc = run_subprocess(
            cmd,
            log_path or os.path.join(work, "export_hf.log"),
            levanter_env(None, env),
            work,
            f"{LAUNCH_MARK} export {checkpoint_path} -> {output_dir} at {_dt.datetime.now().isoformat()}",
        )
        if rc != 0:
            why = exit_reason(rc).replace("train_lm", "the HF export", 1)
            raise TrainingFailed(f"HF export of {checkpoint_path} failed: {why}; see {log_path}")
        if not remote:
            if os.path.lexists(output_dir):
                shutil.rmtree(output_dir)
            os.rename(tmp_out, output_dir)
        return output_dir
    finally:
        for p in (spec_path, cfg_path):
            with contextlib.suppress(FileNotFoundError):
                os.remove(p)
        if not remote and os.path.exists(tmp_out):
            shutil.rmtree(tmp_out, ignore_errors=True)


def _export_main(spec_path: str) -> None:
    """Subprocess entry point of ``export_hf``: mirrors train_lm's converter / model / vocab setup,
    loads ``model`` from the trainer checkpoint and calls ``converter.save_pretrained``."""
    import draccus
    import equinox as eqx
    import haliax as hax
    import jax
    import jax.numpy as jnp
    from haliax import Axis
    from haliax.partitioning import round_axis_for_partitioning

    import levanter.config  # noqa: F401  (registers draccus codecs, e.g. timedelta)
    import levanter.utils.logging
    from levanter.checkpoint import load_checkpoint
    from levanter.main.train_lm import TrainLmConfig
    from levanter.utils.jax_utils import is_inexact_arrayish

    with open(spec_path) as f:
        spec = json.load(f)
    config: TrainLmConfig = draccus.parse(config_class=TrainLmConfig, config_path=spec["config_path"], args=[])
    levanter.utils.logging.init_logging(os.path.join(os.getcwd(), "logs"), "export_hf")
    tokenizer = config.data.the_tokenizer
    converter = config.model.hf_checkpoint_converter()
    if config.initialize_from_hf:
        if isinstance(config.initialize_from_hf, str):
            converter = converter.replaced(reference_checkpoint=config.initialize_from_hf, tokenizer=tokenizer)
        else:
            converter = converter.replaced(tokenizer=tokenizer)
        if config.use_hf_model_config:
            config.model = converter.config_from_hf_config(converter.default_hf_config)
    else:
        converter = converter.replaced(tokenizer=tokenizer)

    trainer = config.trainer
    with trainer.use_device_mesh(), hax.axis_mapping(trainer.parameter_axis_mapping):
        Vocab = round_axis_for_partitioning(Axis("vocab", len(tokenizer)), trainer.parameter_axis_mapping)
        model = eqx.filter_eval_shape(config.model.build, Vocab, key=jax.random.PRNGKey(0))
        trainable, non_trainable = eqx.partition(model, is_inexact_arrayish)
        trainable = load_checkpoint(
            trainable,
            spec["checkpoint_path"],
            subpath="model",
            discover_latest=False,
            axis_mapping=trainer.parameter_axis_mapping,
            mesh=trainer.device_mesh,
        )
        model = eqx.combine(trainable, non_trainable)
        dtype = jnp.dtype(config.hf_save_dtype) if config.hf_save_dtype else None
        converter.save_pretrained(model, spec["output_dir"], upload_to_hf=False, dtype=dtype)


if __name__ == "__main__":
    _export_main(sys.argv[1])
