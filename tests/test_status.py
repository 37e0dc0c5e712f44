"""Unit tests of `trajsft status`: the state machine on gathered facts (status_row.row, every state,
its precedence and transitions, each asserting the exact row), and the gathering on real small
files (status.gather; the Ray job list faked), including the resume checkpoint, which must be the one
Levanter's own discovery picks."""

from __future__ import annotations

import json
import os
import socket

import fsspec
import pytest

from trajsft.plan import step_configs
from trajsft.plan import config as C
from trajsft.cluster import jobs as cluster_jobs
from trajsft.observe import status
from trajsft.observe.status_row import Facts, Job, needs_resume_point, render, row

H = "abc1234567"
RUN = f"demo-{H}"
checkpoints = f"results/checkpoints/{RUN}"
LOG = f"{checkpoints}/train.log"


def facts(**kw) -> Facts:
    return Facts(**{"target": "demo", "hash": H, "run": RUN, "cluster": "local", "checkpoint_dir": checkpoints, "log": LOG,
                    **kw})


def expect(**kw) -> dict:
    r = {"target": "demo", "state": "not started", "hash": H, "run": RUN, "cluster": "local", "ray_job_id": None,
         "attempt": None, "step": None, "steps_total": None, "loss": None, "eval_loss": None, "wandb_url": None,
         "checkpoint_dir": checkpoints, "hf_export": None, "log": LOG, "cause": None, "next": None, "preemptions": 0,
         "failures": 0, "detail": None, "wandb_offline": None, "previous_done": None, "finished_elsewhere": None}
    assert set(kw) <= set(r), set(kw) - set(r)
    return {**r, **kw}


def job(attempt, st, message=""):
    return Job(f"trajsft-{H}-a{attempt}", attempt, st, message)


DONE = {"target": "demo", "hash": H, "run": RUN, "finished": "2026-11-20T10:00:00+00:00", "steps": 27,
        "final_loss": 3.343, "hf_export": f"{checkpoints}/hf/step-26", "attempts": 2, "ray_job_id": None, "cluster": "local"}
OLD = {**DONE, "hash": "0ld0000000", "run": "demo-0ld0000000", "finished": "2026-11-19T10:00:00+00:00",
       "hf_export": "results/checkpoints/demo-0ld0000000/hf/step-26"}
OLD_SUMMARY = {k: OLD[k] for k in ("run", "hash", "finished", "hf_export", "steps", "final_loss")}


# ---- not started / data ready / progress ----------------------------------------------------
def test_not_started_row_and_its_key_order():
    r = row(facts())
    assert r == expect()
    assert list(r) == list(expect())  # --json prints keys in this order
    assert not needs_resume_point(facts())


def test_data_ready_says_where_the_next_run_starts():
    assert row(facts(data_ready=True)) == expect(state="data ready", next="start from step 0")
    assert row(facts(data_ready=True, resume_step=6)) == expect(state="data ready", next="resume from step 6")
    assert needs_resume_point(facts(data_ready=True))


def test_progress_from_levanter_metrics():
    metrics = {0: {"train/loss": 3.0}, 1: {"train/loss": 2.5, "eval/loss": 2.9}, 3: {"eval/loss": 2.7},
               4: {"train/loss": 2.0, "learning_rate": 1e-4}}
    f = facts(data_ready=True, steps_total=12, metrics=metrics, hf_export=f"{checkpoints}/hf/step-3", resume_step=5)
    assert row(f) == expect(state="data ready", step=5, steps_total=12, loss=2.0, eval_loss=2.7,
                            hf_export=f"{checkpoints}/hf/step-3", next="resume from step 5")


# ---- a local run: the newest attempt --------------------------------------------------------
def test_running_attempt_whose_process_lives():
    f = facts(data_ready=True, attempts=({"attempt": 1, "outcome": "running"},), attempt_alive=True, resume_step=3)
    assert row(f) == expect(state="training running", attempt=1, next="resume from step 3")


@pytest.mark.parametrize("attempt,cause", [
    ({"attempt": 2, "outcome": "running"}, "killed (no end recorded)"),  # its process is gone
    ({"attempt": 2, "outcome": "interrupted"}, "killed (no end recorded)"),
    ({"attempt": 2, "outcome": "interrupted", "error": "trajsft train demo: stopped on SIGTERM"}, "stopped"),
    ({"attempt": 2, "outcome": "interrupted", "error": "got SIGINT"}, "stopped"),  # Ctrl-C of a local training
    ({"attempt": 2, "outcome": "failed", "error": "train_lm was killed by signal 9 (SIGKILL; out of memory?)"},
     "out of memory"),
    ({"attempt": 2, "outcome": "failed", "error": "ray.exceptions.NodeDiedError: node died"}, "preempted / node lost"),
    ({"attempt": 2, "outcome": "failed", "error": "trajsft tokenize demo: no usable rows in shard 0"}, "data error"),
    ({"attempt": 2, "outcome": "failed", "error": "trajsft preflight: no TPU"}, "preflight"),
    ({"attempt": 2, "outcome": "failed", "error": "ValueError: " + "x" * 300}, "ValueError: " + "x" * 188),
    ({"attempt": 2, "outcome": "failed"}, "failed"),
])
def test_failed_attempt_with_each_cause(attempt, cause):
    f = facts(data_ready=True, attempts=({"attempt": 1, "outcome": "failed", "error": "OOM"}, attempt))
    # a stop (Ctrl-C, SIGTERM) is no failure: the row says stopped, and where the rerun resumes
    assert row(f) == expect(state="stopped" if cause == "stopped" else "failed", attempt=2, cause=cause,
                            next="start from step 0")
    assert needs_resume_point(f)


def test_the_log_tail_names_the_cause_an_error_does_not():
    f = facts(data_ready=True, attempts=({"attempt": 1, "outcome": "failed", "error": "train_lm exited 1"},),
              log_tail="...\njaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory\n")
    assert row(f) == expect(state="failed", attempt=1, cause="out of memory", next="start from step 0")


def test_a_finished_or_preempted_attempt_leaves_the_data_state():
    for outcome in ("finished", "preempted"):
        f = facts(data_ready=True, attempts=({"attempt": 1, "outcome": outcome},))
        assert row(f) == expect(state="data ready", attempt=1, next="start from step 0")


# ---- a Ray run: the job list ----------------------------------------------------------------
@pytest.mark.parametrize("st", ["PENDING", "RUNNING"])
def test_ray_job_running_or_pending(st):
    f = facts(cluster="c1", data_ready=True, jobs=(job(0, st),), resume_step=4)
    assert row(f) == expect(state="training running", cluster="c1", ray_job_id=f"trajsft-{H}-a0", attempt=1,
                            next="resume from step 4")


@pytest.mark.parametrize("earlier,cause", [
    (job(0, "FAILED", "The node with node id abc has been marked dead"), "preempted / node lost"),
    (job(0, "FAILED", "RESOURCE_EXHAUSTED"), "out of memory"),
    (job(0, "STOPPED", "Job was intentionally stopped"), "stopped"),
    (job(0, "FAILED", "exit code 1"), "failed"),
])
def test_ray_retrying_after_a_failed_attempt(earlier, cause):
    f = facts(cluster="c1", data_ready=True, jobs=(earlier, job(1, "RUNNING")), resume_step=8)
    assert row(f) == expect(state="retrying", cluster="c1", ray_job_id=f"trajsft-{H}-a1", attempt=2, cause=cause,
                            next="resume from step 8")


def test_ray_running_after_a_succeeded_attempt_is_not_a_retry():
    f = facts(data_ready=True, jobs=(job(0, "SUCCEEDED"), job(1, "RUNNING")))
    assert row(f) == expect(state="training running", ray_job_id=f"trajsft-{H}-a1", attempt=2,
                            next="start from step 0")


@pytest.mark.parametrize("message,log_tail,cause", [
    ("Job entrypoint command failed", "RESOURCE_EXHAUSTED: Out of memory", "out of memory"),
    ("ray.exceptions.ActorDiedError: The actor died unexpectedly", "", "preempted / node lost"),
    ("weird " * 60, "", ("weird " * 60)[:200]),
    ("", "", "failed"),
])
def test_ray_job_failed(message, log_tail, cause):
    f = facts(data_ready=True, jobs=(job(0, "FAILED", message),), log_tail=log_tail)
    assert row(f) == expect(state="failed", ray_job_id=f"trajsft-{H}-a0", attempt=1, cause=cause,
                            next="start from step 0")


def test_ray_job_stopped_is_stopped_whatever_its_log_shows():
    f = facts(data_ready=True, jobs=(job(0, "STOPPED", "OOM"),), log_tail="RESOURCE_EXHAUSTED")
    assert row(f) == expect(state="stopped", ray_job_id=f"trajsft-{H}-a0", attempt=1, cause="stopped",
                            next="start from step 0")


def test_ray_job_succeeded_before_its_done_marker():
    f = facts(data_ready=True, jobs=(job(0, "SUCCEEDED"),))
    assert row(f) == expect(state="data ready", ray_job_id=f"trajsft-{H}-a0", attempt=1, next="start from step 0")


def test_ray_jobs_take_precedence_over_the_attempts():
    f = facts(data_ready=True, jobs=(job(0, "RUNNING"),), attempts=({"attempt": 1, "outcome": "failed", "error": "x"},))
    assert row(f) == expect(state="training running", ray_job_id=f"trajsft-{H}-a0", attempt=1,
                            next="start from step 0")


def test_unreachable_cluster_falls_back_to_the_attempts():
    f = facts(data_ready=True, cluster_error="connection refused")
    assert row(f) == expect(state="data ready", cause="cluster not reachable: connection refused",
                            next="start from step 0")
    f = facts(data_ready=True, cluster_error="connection refused", attempts=({"attempt": 1, "outcome": "running"},))
    assert row(f) == expect(state="failed", attempt=1, cause="killed (no end recorded)", next="start from step 0")


# ---- preflight ------------------------------------------------------------------------------
def test_preflight_refusal_in_the_launcher_log():
    pre = ("submitting", "trajsft preflight: no TPU v5p-8 slice free (0/4)")
    for ready, in ((False,), (True,)):
        f = facts(data_ready=ready, launcher_tail=pre)
        assert row(f) == expect(state="failed", cause="preflight: no TPU v5p-8 slice free (0/4)",
                                next="start from step 0")
        assert needs_resume_point(f)
    # a job that runs after an earlier refusal is what it is
    f = facts(data_ready=True, launcher_tail=pre, jobs=(job(0, "RUNNING"),))
    assert row(f)["state"] == "training running" and row(f)["cause"] is None
    assert row(facts(launcher_tail=("submitting", "job submitted"))) == expect()


# ---- slices: waiting, preempted Nx, resumed -------------------------------------------------
def test_waiting_for_a_slice():
    att = {"attempt": 1, "outcome": "running", "slice_attempts": [
        {"outcome": "preempted", "slices": ["s-a"], "hosts": ["h1", "h2"], "cause": "preempted"},
        {"outcome": "waiting for slice", "tpu_type": "v5p-16", "started": "2026-11-20T10:00:00",
         "resumed_from_step": 12}]}
    f = facts(cluster="c1", data_ready=True, attempts=(att,), jobs=(job(0, "RUNNING"),), resume_step=12)
    assert row(f) == expect(state="training running", cluster="c1", ray_job_id=f"trajsft-{H}-a0", attempt=1,
                            next="resume from step 12", preemptions=1, detail=(
                                "preempted 1x, waiting for a v5p-16 slice since 2026-11-20T10:00:00 "
                                "(resumes at step 12)"))


def test_preempted_twice_then_resumed_on_another_slice():
    att = {"attempt": 1, "outcome": "running", "slice_attempts": [
        {"outcome": "preempted", "slices": ["s-a"], "hosts": ["h1", "h2"]},
        {"outcome": "preempted", "slices": ["s-a"], "hosts": ["h1", "h2"], "resumed_from_step": 6},
        {"outcome": "running", "slices": ["s-b"], "hosts": ["h3", "h4"], "resumed_from_step": 12}]}
    f = facts(data_ready=True, attempts=(att,), jobs=(job(0, "RUNNING"),), resume_step=14)
    assert row(f) == expect(state="training running", ray_job_id=f"trajsft-{H}-a0", attempt=1,
                            next="resume from step 14", preemptions=2,
                            detail="preempted 2x, resumed at step 12 on slice s-b (2 hosts)")


def test_a_failed_slice_names_its_cause():
    att = {"attempt": 1, "outcome": "failed", "error": "slice failed", "slice_attempts": [
        {"outcome": "failed", "slices": ["s-a"], "hosts": ["h1"], "cause": "out of memory"}]}
    f = facts(data_ready=True, attempts=(att,))
    assert row(f) == expect(state="failed", attempt=1, cause="slice failed", next="start from step 0", failures=1,
                            detail="failed 1x, on slice s-a (1 hosts), last: out of memory")


# ---- done, and done for a previous hash -----------------------------------------------------
def test_done_beats_every_training_fact():
    busy = dict(data_ready=True, attempts=({"attempt": 2, "outcome": "failed", "error": "OOM"},),
                jobs=(job(1, "FAILED", "OOM"),), launcher_tail=("trajsft preflight: no",), resume_step=3,
                metrics={0: {"train/loss": 9.0}}, steps_total=99)
    f = facts(done=DONE, **busy)
    assert row(f) == expect(state="done", step=27, steps_total=27, loss=3.343, hf_export=f"{checkpoints}/hf/step-26",
                            attempt=2)
    assert not needs_resume_point(f)


def test_done_takes_cluster_job_and_wandb_from_the_marker():
    f = facts(cluster="c1", wandb_url="https://wandb.ai/e/p/runs/" + H,
              done={**DONE, "cluster": "tpu-east5", "ray_job_id": f"trajsft-{H}-a1", "wandb_url": "https://w/x"})
    assert row(f) == expect(state="done", cluster="tpu-east5", ray_job_id=f"trajsft-{H}-a1", attempt=2, step=27,
                            steps_total=27, loss=3.343, hf_export=f"{checkpoints}/hf/step-26", wandb_url="https://w/x")
    f = facts(cluster="c1", wandb_url="https://wandb.ai/e/p/runs/" + H, done={**DONE, "cluster": None})
    assert row(f) == expect(state="done", cluster="c1", attempt=2, step=27, steps_total=27, loss=3.343,
                            hf_export=f"{checkpoints}/hf/step-26", wandb_url="https://wandb.ai/e/p/runs/" + H)


def test_done_for_a_previous_hash_then_back_to_it():
    # the marker is of an older config: the row is the current config's, a line names the old run
    f = facts(done=OLD, manifests=(OLD,), data_ready=True)
    assert row(f) == expect(state="data ready", next="start from step 0", previous_done=OLD_SUMMARY)
    # Snakemake deleted the marker when the new run failed: the kept manifest still names it
    f = facts(manifests=(OLD,), data_ready=True)
    assert row(f) == expect(state="data ready", next="start from step 0", previous_done=OLD_SUMMARY)
    # back to the old config (its marker gone, the new one's left): done, only the marker to rewrite
    f = facts(done={**DONE, "hash": "n3w0000000", "run": "demo-n3w0000000", "finished": "2026-11-21T10:00:00+00:00"},
              kept=DONE, manifests=(DONE,), jobs=(job(0, "FAILED"),))
    assert row(f) == expect(state="done", step=27, steps_total=27, loss=3.343, hf_export=f"{checkpoints}/hf/step-26",
                            attempt=2, next="rewrite the missing done marker (no training)", previous_done={
                                "run": "demo-n3w0000000", "hash": "n3w0000000",
                                "finished": "2026-11-21T10:00:00+00:00", "hf_export": f"{checkpoints}/hf/step-26",
                                "steps": 27, "final_loss": 3.343})


def test_a_run_of_this_hash_finished_under_another_root_is_not_done_here():
    """A local run's marker read under a Ray profile (same hash: the storage root is cosmetic): not done, as
    Snakemake trains it again into the profile's bucket; the row says where it finished, and the local log's
    figures are not this run's progress."""
    gs = f"gs://b/trajsft/checkpoints/{RUN}"
    away = {k: DONE.get(k) for k in ("run", "checkpoint_dir", "cluster", "finished", "hf_export", "steps", "final_loss")}
    away["checkpoint_dir"] = checkpoints
    for where in ({"done": {**DONE, "checkpoint_dir": checkpoints}}, {"kept": {**DONE, "checkpoint_dir": checkpoints}}):
        f = facts(cluster="east5", checkpoint_dir=gs, data_ready=True, metrics={24: {"train/loss": 3.1}}, **where)
        assert row(f) == expect(state="data ready", cluster="east5", checkpoint_dir=gs, next="start from step 0",
                                finished_elsewhere=away)
        assert needs_resume_point(f)
        line = [ln for ln in render([row(f)]).splitlines() if "finished as" in ln]
        assert line == [f"  demo: this config finished as {RUN} in {checkpoints} (cluster local, {DONE['finished']}, "
                        f"HF export {DONE['hf_export']}), not in this row's {gs}"]
    # once this directory's run has an attempt, the log is its own: its progress shows
    f = facts(cluster="east5", checkpoint_dir=gs, done={**DONE, "checkpoint_dir": checkpoints},
              metrics={3: {"train/loss": 5.0}}, attempts=({"attempt": 1, "outcome": "failed", "error": "OOM"},))
    assert (row(f)["state"], row(f)["step"], row(f)["loss"]) == ("failed", 4, 5.0)
    # the same directory spelled with a trailing slash or ./, and a marker naming none: done here
    for d in (f"{checkpoints}/", f"./{checkpoints}", None):
        assert row(facts(done={**DONE, "checkpoint_dir": d}))["state"] == "done", d
    assert row(facts(checkpoint_dir=gs, done={**DONE, "checkpoint_dir": gs + "/"}))["state"] == "done"


def test_previous_run_is_the_latest_finished_one_of_this_target():
    older = {**OLD, "hash": "0lder00000", "run": "demo-0lder00000", "finished": "2026-11-18T10:00:00+00:00"}
    other = {**OLD, "target": "mix-all", "hash": "m1x0000000", "finished": "2026-11-30T00:00:00+00:00"}
    unfinished = {**OLD, "hash": "unf0000000", "finished": None}
    f = facts(done=older, manifests=(OLD, other, unfinished, [1], None, {**DONE, "finished": "2027"}))
    assert row(f)["previous_done"] == OLD_SUMMARY
    assert row(facts(manifests=(other, unfinished)))["previous_done"] is None
    # a kept manifest of the current hash that never finished is not done
    assert row(facts(kept={**DONE, "finished": None}))["state"] == "not started"


def test_render_of_a_failed_row():
    r = row(facts(data_ready=True, steps_total=12, metrics={4: {"train/loss": 2.0}}, manifests=(OLD,),
                  attempts=({"attempt": 1, "outcome": "failed", "error": "killed by signal 9 (out of memory?)"},),
                  resume_step=5, wandb_url="https://wandb.ai/e/p/runs/" + H))
    assert render([r]).splitlines() == [
        "TARGET  STATE   HASH        CLUSTER  RAY JOB  TRY  STEP  LOSS  ",
        f"demo    failed  {H}  local    -        1    5/12  2.0000",
        f"  demo: checkpoints {checkpoints}; W&B https://wandb.ai/e/p/runs/{H}",
        f"  demo: config changed since the finished run demo-0ld0000000 (2026-11-19T10:00:00+00:00, HF export "
        f"{OLD['hf_export']}); the row above is the current config (hash {H})",
        "  demo: cause: out of memory; next rerun will resume from step 5",
    ]


# ---- gathering on real files ----------------------------------------------------------------
def _write(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(obj if isinstance(obj, str) else json.dumps(obj))


def _checkpoint(d, step, ts, temporary=False):
    _write(os.path.join(d, "metadata.json"), {"step": step, "timestamp": ts, "is_temporary": temporary})


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _plan(**overrides):
    return C.Plan(C.load([C.DEFAULT_CONFIG], overrides))


def test_gather_a_failed_local_run(workdir):
    plan = _plan()
    run = plan.target("demo")["run"]
    state_dir = f"results/checkpoints/{run.name}"
    for a in plan.target("demo")["tokenized"]:
        _write(a.manifest, {})
    _write(f"{run.location}/attempts.json", [{"attempt": 1, "outcome": "running", "pid": 1 << 30,
                                               "hostname": socket.gethostname()}])
    _write(f"{run.location}/provenance/config.json", {"levanter": {"trainer": {"num_train_steps": 12}}})
    log = 'x INFO levanter.json_logger y :: {"event": "log", "step": 3, "metrics": {"train/loss": 2.5}}\n'
    _write(f"{state_dir}/train.log", log + "Killed\n")
    _checkpoint(f"{run.location}/checkpoints/step-3", 3, "2026-01-01T00:00:00")
    _write("checkpoints/demo/done", OLD)
    _write("results/checkpoints/demo-0ld0000000/manifest.json", OLD)
    f = status.gather(step_configs.train(plan, "demo"), query_ray=True)
    assert f == Facts(
        target="demo", hash=run.hash, run=run.name, cluster="local", checkpoint_dir=run.location,
        log=f"{state_dir}/train.log", done=OLD, kept=None, manifests=(OLD,),
        attempts=({"attempt": 1, "outcome": "running", "pid": 1 << 30, "hostname": socket.gethostname()},),
        data_ready=True, steps_total=12, metrics={3: {"train/loss": 2.5}}, log_tail=log + "Killed",
        attempt_alive=False, resume_step=4)
    r = status.target_status(step_configs.train(plan, "demo"))
    assert (r["state"], r["cause"], r["next"], r["step"]) == ("failed", "killed (no end recorded)",
                                                              "resume from step 4", 4)


def test_gather_reads_no_training_facts_for_a_finished_run(workdir):
    plan = _plan()
    run = plan.target("demo")["run"]
    done = {**DONE, "hash": run.hash, "run": run.name}
    _write("checkpoints/demo/done", done)
    _write(f"results/checkpoints/{run.name}/manifest.json", done)
    _write(f"results/checkpoints/{run.name}/train.log", "RESOURCE_EXHAUSTED\n")
    _checkpoint(f"{run.location}/checkpoints/step-3", 3, "2026-01-01T00:00:00")
    f = status.gather(step_configs.train(plan, "demo"))
    assert (f.done, f.kept, f.manifests) == (done, done, (done,))
    assert (f.log_tail, f.data_ready, f.resume_step) == ("", False, None)
    assert not needs_resume_point(f)
    # not started: nothing on disk, no checkpoint looked up
    g = status.gather(step_configs.train(plan, "mix-all"))
    assert (g.done, g.attempts, g.resume_step, g.data_ready) == (None, (), None, False)
    assert status.target_status(step_configs.train(plan, "mix-all"))["state"] == "not started"


def test_offline_wandb_runs_are_shown_with_the_command_that_uploads_them(workdir):
    """wandb.mode: offline (the default): the SDK writes offline-run-* in the run dir; status says how to sync them,
    for a finished run too; none written, or online: nothing said."""
    plan = _plan()
    tc = step_configs.train(plan, "demo")
    assert status.gather(tc).wandb_offline is None
    run = plan.target("demo")["run"]
    done = {**DONE, "hash": run.hash, "run": run.name}
    _write("checkpoints/demo/done", done)
    _write(f"{run.location}/wandb/offline-run-20261129_070420-{run.hash}/run-{run.hash}.wandb", "")
    glob = f"{run.location}/wandb/offline-run-*"
    f = status.gather(tc)
    assert f.wandb_offline == glob
    r = status.target_status(tc)
    assert r["state"] == "done" and r["wandb_offline"] == glob
    assert f"  demo: W&B offline: `wandb sync {glob}` uploads its runs (with WANDB_API_KEY; wandb.mode: online logs " \
           "the next ones live)" in render([r]).splitlines()
    online = step_configs.train(_plan(wandb={"mode": "online", "entity": "e"}), "demo")
    assert status.gather(online).wandb_offline is None


def test_gather_the_ray_job_list(workdir, monkeypatch):
    plan = _plan(executor="ray", ray={"address": "http://127.0.0.1:9", "cluster": "c1"})
    run = plan.target("demo")["run"]
    seen = []

    def run_jobs(address, content_hash):
        seen.append((address, content_hash))
        return [{"submission_id": f"trajsft-{run.hash}-a0", "attempt": 0, "status": "FAILED", "message": "OOM",
                 "start_time": 1, "end_time": 2, "metadata": {}}]

    monkeypatch.setattr(cluster_jobs, "run_jobs", run_jobs)
    f = status.gather(step_configs.train(plan, "demo"))
    assert f.cluster == "c1" and f.jobs == (Job(f"trajsft-{run.hash}-a0", 0, "FAILED", "OOM"),)
    assert f.cluster_error is None and seen == [("http://127.0.0.1:9", run.hash)]
    assert status.gather(step_configs.train(plan, "demo"), query_ray=False).jobs == () and len(seen) == 1  # --offline

    def unreachable(address, content_hash):
        raise cluster_jobs.RayJobsError("Ray cluster at http://127.0.0.1:9 is not reachable")

    monkeypatch.setattr(cluster_jobs, "run_jobs", unreachable)
    f = status.gather(step_configs.train(plan, "demo"))
    assert (f.jobs, f.cluster_error) == ((), "Ray cluster at http://127.0.0.1:9 is not reachable")


# ---- the resume checkpoint is the one Levanter picks ----------------------------------------
LAYOUTS = {
    "temporary newer than permanent": [("step-10", 9, "2026-01-01T00:00:00", False),
                                       ("step-14", 13, "2026-01-01T00:10:00", True)],
    "permanent newer than temporary": [("step-10", 9, "2026-01-01T00:20:00", False),
                                       ("step-14", 13, "2026-01-01T00:10:00", True)],
    "equal timestamps: the higher step": [("a", 13, "2026-01-01T00:00:00", True),
                                          ("b", 11, "2026-01-01T00:00:00", False)],
    "equal timestamp and step: the first listed": [("b", 5, "2026-01-01T00:00:00", False),
                                                   ("a", 5, "2026-01-01T00:00:00", True)],
    "the directory itself": [(".", 7, "2026-01-01T00:30:00", False), ("step-3", 2, "2026-01-01T00:00:00", False)],
    "a half-written save is ignored": [("step-3", 2, "2026-01-01T00:00:00", False), ("step-9", None, None, False)],
    "no checkpoint": [("step-9", None, None, False)],
    "empty": [],
}


def _layout(root, entries, fs=None):
    for name, step, ts, tmp in entries:
        d = root if name == "." else f"{root}/{name}"
        if step is None:  # a save in progress: the dir without its metadata.json
            fs.makedirs(d, exist_ok=True) if fs else os.makedirs(d, exist_ok=True)
            continue
        meta = json.dumps({"step": step, "timestamp": ts, "is_temporary": tmp})
        if fs:
            fs.pipe_file(f"{d}/metadata.json", meta.encode())
        else:
            _write(f"{d}/metadata.json", meta)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_resume_checkpoint_status_shows_is_the_one_levanter_discovers(tmp_path, layout):
    from levanter.checkpoint import discover_latest_checkpoint

    from trajsft.train import checkpoints

    root = str(tmp_path / "checkpoints")
    os.makedirs(root)
    _layout(root, LAYOUTS[layout])
    (tmp_path / "checkpoints" / "notes.txt").write_text("a file, not a checkpoint")
    ours, theirs = checkpoints.latest_checkpoint(root), discover_latest_checkpoint(root)
    assert (ours and os.path.realpath(ours["path"])) == (theirs and os.path.realpath(theirs))
    if layout == "temporary newer than permanent":
        assert ours["completed_steps"] == 14 and ours["is_temporary"]
    assert checkpoints.latest_checkpoint(str(tmp_path / "missing")) is None


def test_the_resume_checkpoint_in_a_bucket():
    from levanter.checkpoint import discover_latest_checkpoint

    from trajsft.train import checkpoints

    fs = fsspec.filesystem("memory")
    root = "memory://trajsft-status-test/run/checkpoints"
    try:
        _layout(root, LAYOUTS["temporary newer than permanent"], fs=fs)
        ours = checkpoints.latest_checkpoint(root)
        assert ours["path"] == discover_latest_checkpoint(root)  # fsspec's memory fs roots its paths at "/"
        assert ours["path"].replace(":///", "://") == f"{root}/step-14"
        assert ours["completed_steps"] == 14
        assert checkpoints.latest_checkpoint("memory://trajsft-status-test/none") is None
    finally:
        fs.rm("/trajsft-status-test", recursive=True)
