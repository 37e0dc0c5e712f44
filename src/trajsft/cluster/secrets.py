"""Secret delivery to a Ray job (the values never show where Ray displays jobs).

Secrets (HF_TOKEN, WANDB_API_KEY, ...)
-------------------------------------
``runtime_env["env_vars"]`` is stored verbatim in the GCS job table and served
by ``get_job_info``/``list_jobs`` (the dashboard redacts it only for *browser*
requests), and the entrypoint string is echoed into the first line of the job
log.  So secret values must go neither there nor into metadata.  Instead,
``submit_or_attach`` delivers them like this:

1. Every variable named in ``env_vars`` (values taken from our environment, or
   given explicitly in a mapping), plus any secret-looking name
   (``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``, ``*API_KEY*``, ...) found in the
   caller's ``runtime_env["env_vars"]``, is written to ``secrets.json`` (mode
   0600) inside a throw-away Python package ``trajsft_secrets_<random>``
   created in a private ``mkdtemp`` directory (mode 0700) *outside* any
   workdir.
2. That directory is appended to ``runtime_env["py_modules"]``.  The Ray client
   zips it and uploads it over the authenticated dashboard connection into the
   cluster's GCS as ``gcs://_ray_pkg_<content-hash>.zip`` (a random nonce in
   the package makes the hash unique and unguessable; Ray's hash ignores the
   directory name).  The local directory is deleted right after the upload,
   whether or not the submission succeeded.
3. The entrypoint becomes ``python -m trajsft_secrets_<random> '<original>'``.
   That wrapper (stdlib only) reads ``secrets.json``, deletes it from the
   extracted package directory, puts the values into ``os.environ``, removes
   its own package from the job config that the driver passes on to its
   tasks/actors (``RAY_JOB_CONFIG_JSON_ENV_VAR``, so worker nodes never
   download the bundle), and ``exec``-s ``/bin/sh -c '<original>'``.

What Ray shows (job info, list_jobs, state API, job log) therefore contains
only the variable *names* (metadata ``trajsft_forwarded_env``), the wrapper
module name and the package URI.  ``follow`` additionally replaces any
occurrence of a forwarded value in the streamed log with ``<redacted:NAME>``
(defence in depth against a job printing its own environment), and
``submit_or_attach`` refuses to submit if a secret value occurs in the
entrypoint, metadata or the remaining runtime_env.

The wrapper also exports the package URI (``TRAJSFT_SECRETS_URI``) and the
delivered names (``TRAJSFT_SECRET_NAMES``); the training driver
(:mod:`trajsft.cluster.entrypoint`) deletes the zip from the GCS internal KV as soon
as it has connected, and hands the values to its hosts through an actor on its
own node (:func:`trajsft.cluster.slices.driver_channel`).

Residual exposure (inherent to Ray, documented rather than hidden): the values
live in the driver process environment and in the memory of the hosts' training
processes.  Anyone who
can authenticate to the cluster can run arbitrary code on it and could read
both, so cluster access is equivalent to secret access either way; what this
scheme guarantees is that secrets are not *displayed* by job listings,
dashboards, ``ray job`` CLI output, job logs or the files we write.  The
driver's children inherit the variables; if the driver forwards them to remote
tasks via a task-level ``runtime_env`` they become visible in the state API
for those tasks -- the training code must not do that.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets as _secrets
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path


SECRET_NAME_RE = re.compile(
    r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|APIKEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL)",
    re.IGNORECASE,
)
_WRAPPER_PREFIX = "trajsft_secrets_"


# --------------------------------------------------------------------------- secrets


_WRAPPER_MAIN = r'''"""trajsft secret-delivery wrapper (generated; see trajsft.cluster.secrets)."""
import json
import os
import sys

def _main():
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "secrets.json")
    try:
        with open(path) as f:
            values = json.load(f)
    except FileNotFoundError:
        sys.stderr.write("trajsft: secret bundle already consumed or missing\n")
        sys.exit(97)
    try:
        os.unlink(path)
    except OSError:
        pass
    os.environ.update({str(k): str(v) for k, v in values.items()})
    pkg = os.path.basename(os.path.dirname(here))  # _ray_pkg_<hash>
    # the driver deletes the package from the cluster's KV store as soon as it is connected
    os.environ["TRAJSFT_SECRETS_URI"] = "gcs://" + pkg + ".zip"
    os.environ["TRAJSFT_SECRET_NAMES"] = ",".join(sorted(str(k) for k in values))
    # Keep the bundle out of the job config the driver hands to its workers, so
    # tasks/actors on other nodes never download (and keep) the secrets file.
    cfg = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    if cfg:
        try:
            conf = json.loads(cfg)
            renv = conf.get("runtime_env") or {}
            mods = renv.get("py_modules") or []
            keep = [m for m in mods if not str(m).rstrip("/").endswith(pkg + ".zip")]
            if len(keep) != len(mods):
                if keep:
                    renv["py_modules"] = keep
                else:
                    renv.pop("py_modules", None)
                os.environ["RAY_JOB_CONFIG_JSON_ENV_VAR"] = json.dumps(conf)
        except Exception:
            pass
    os.execv("/bin/sh", ["/bin/sh", "-c", sys.argv[1]])

_main()
'''


def collect_secrets(
    env_vars: Mapping[str, str] | Iterable[str] | None,
    runtime_env: dict,
) -> dict[str, str]:
    """Secret name -> value; moves secret-looking runtime_env env_vars out."""
    out: dict[str, str] = {}
    if env_vars:
        if isinstance(env_vars, Mapping):
            items = list(env_vars.items())
        else:
            items = []
            for name in env_vars:
                if name not in os.environ:
                    raise ValueError(
                        f"env var {name} is to be forwarded to the Ray job but is not set: export {name}=..."
                    )
                items.append((name, os.environ[name]))
        for name, value in items:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
                raise ValueError(f"invalid environment variable name {name!r}")
            out[name] = str(value)
    renv_vars = runtime_env.get("env_vars")
    if isinstance(renv_vars, dict):
        for name in [n for n in renv_vars if SECRET_NAME_RE.search(n)]:
            out.setdefault(name, str(renv_vars[name]))
            del renv_vars[name]
        if not renv_vars:
            runtime_env.pop("env_vars")
    return out


def assert_not_leaked(secrets: Mapping[str, str], **places: str) -> None:
    for name, value in secrets.items():
        if not value:
            continue
        for where, text in places.items():
            if value in text:
                raise ValueError(
                    f"the value of {name} appears in the job {where}; refusing to submit "
                    "(secrets are only delivered through the secret bundle)"
                )


@contextlib.contextmanager
def secret_bundle(values: Mapping[str, str]):
    """Yield (module_name, dir) of a temporary package holding secrets.json."""
    tmp = tempfile.mkdtemp(prefix="trajsft-sec-")  # 0700, outside any workdir
    try:
        name = _WRAPPER_PREFIX + _secrets.token_hex(16)
        pkg = Path(tmp) / name
        pkg.mkdir(mode=0o700)
        # Ray's package URI hashes file contents but not the top-level directory
        # name: without a nonce, two bundles with equal secrets would share a URI,
        # and the second job would find the (already consumed) cached copy.
        (pkg / "__init__.py").write_text(f"NONCE = {_secrets.token_hex(16)!r}\n")
        (pkg / "__main__.py").write_text(_WRAPPER_MAIN)
        fd = os.open(pkg / "secrets.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(dict(values), f)
        yield name, str(pkg)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def scrub(text: str, secret_values: Mapping[str, str]) -> str:
    for name, value in secret_values.items():
        if value:
            text = text.replace(value, f"<redacted:{name}>")
    return text
