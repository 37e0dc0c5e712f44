"""Train the demo on an emulated 4-host TPU v5p-32 slice (outside CI: about 10-20 minutes on 2 cores).

    uv run python scripts/emulated_v5p32.py [--steps 8] [--keep]

Starts a CPU Ray head plus 4 Ray nodes that present themselves as the hosts of a v5p-32 slice
(tests/slice_fixtures.py: no TPU_* variable, a GCE metadata server per host, as on a TPU VM), builds the demo's data with the tpu-east5 profile (only the Ray address
and the storage root changed), trains `checkpoints/demo/done` with one JAX process per host (4 x 4
CPU devices, data-parallel) and prints wall times, the slice attempts and each host's JAX process index. Everything it starts is
stopped at the end, by pid.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from slice_fixtures import start_emulated_cluster  # noqa: E402
from tpu_utils import data_rules, make_profile, snakemake, workdir  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--keep", action="store_true", help="keep the scratch dir")
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="v5p32-"))
    over = {"ray": {"tpu_type": "v5p-32"},
            "teachers": {"demo": {"training": {"batch_size": 16, "max_steps": a.steps}}}}
    t0 = time.time()
    cluster = start_emulated_cluster({"emu-v5p32": "v5p-32"})
    t_cluster = time.time() - t0
    try:
        t1 = time.time()
        data = data_rules(base, cluster.head, over)
        t_data = time.time() - t1
        wd = workdir(data, "train")
        prof = make_profile(base / "profile", cluster.address, data[1], over)
        t2 = time.time()
        snakemake(wd, prof, cluster.head, timeout=3600)
        t_train = time.time() - t2
        done = json.loads((wd / "checkpoints/demo/done").read_text())
        att = json.loads((Path(done["checkpoint_dir"]) / "attempts.json").read_text())
        for sa in att[-1].get("slice_attempts", []):
            print(f"slice attempt {sa['slice_attempt']}: {sa['outcome']} on {sa['slices']} "
                  f"hosts {sorted((h['slice'], h['worker']) for h in sa['hosts'])}")
        # the hosts have no TPU_* variable: each knew its worker id from its metadata server; Levanter prefixes each
        # line with jax.process_index(), so one process group of 4 shows as processes 0..3, one per host log
        run_dir = Path(done["checkpoint_dir"])
        logs = [run_dir / "train.log", *sorted(run_dir.glob("hosts/*/train-*.log"))]
        for log in logs:
            idx = sorted(set(re.findall(r"^\d{4}-\d\d-\d\dT[\d:]+ - (\d+) - levanter", log.read_text(), re.M)))
            print(f"{log.relative_to(run_dir)}: JAX process {', '.join(idx) or '?'}")
        print(f"cluster up (head + 4 hosts, one at a time): {t_cluster:.0f}s")
        print(f"data rules: {t_data:.0f}s")
        print(f"train {a.steps} steps on 4 hosts x 4 devices to done: {t_train:.0f}s; "
              f"final loss {done['final_loss']:.4f}")
    finally:
        cluster.stop()
        if not a.keep:
            import shutil

            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
