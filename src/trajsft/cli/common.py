"""What every command reads: the plan of the config, profile and overrides it was given, and its targets' training
configs."""

from __future__ import annotations

import os

from ..plan import config as C
from ..plan import step_configs
from ..plan.step_configs import TrainConfig


def load_plan(args) -> C.Plan:
    """The plan of config/config.yaml, the profile's config files, ``--configfile`` and ``--storage-root`` (a
    ``--configfile`` that does not exist: one line, with a hint when it looks like a target)."""
    from ..observe.status import profile_configfiles

    overrides = {}
    if getattr(args, "storage_root", None):
        overrides["storage_root"] = args.storage_root
    extra = args.configfile or []
    for f in extra:
        if os.path.isdir(f):  # `--configfile mine.yaml demo`: the target read as a config file (demo/ is a dir)
            raise C.ConfigError(f"{f} is a directory, not a config file (--configfile takes every following argument, "
                                f"as in snakemake; put targets first: trajsft {args.cmd} {f} --configfile ...)")
        if not os.path.exists(f):
            name = f.removeprefix("checkpoints/").removesuffix("/done")
            hint = (f" ({f!r} looks like a target: --configfile takes every following argument, as in snakemake; "
                    f"put targets first: trajsft {args.cmd} {name} --configfile ...)") if not f.endswith((".yaml", ".yml", ".json")) else ""
            raise C.ConfigError(f"config file not found: {f}{hint}")
    files = [C.DEFAULT_CONFIG, *profile_configfiles(getattr(args, "profile", None)), *extra]
    cfg = C.load(files, overrides)
    args._cfg = cfg
    return C.Plan(cfg, base_dir=C.REPO_DIR)


def named_trainings(plan: C.Plan, names: list[str] | None) -> list[TrainConfig]:
    """The named targets' training configs (``checkpoints/<t>/done`` accepted), else every target's; an unknown
    name is one line naming the targets."""
    names = [n.removeprefix("checkpoints/").removesuffix("/done") for n in names or []]
    return [step_configs.train(plan, n) for n in names or list(plan.targets)]
