"""Tasks that grade themselves (issue 68): a task instance in SWE-smith's fields (:mod:`trajsft.tasks.record`), a
sandbox per episode (:mod:`trajsft.tasks.sandbox`: bubblewrap, no network, limits) and the grader
(:mod:`trajsft.tasks.grade`: a patch applied to a fresh copy of the task's repository, its tests run, resolved iff
every FAIL_TO_PASS passes and every PASS_TO_PASS still passes). A task that names a docker image (SWE-smith's
instances, read from their Hub dataset by :mod:`trajsft.tasks.taskset`) is checked out of and run in that image
(:mod:`trajsft.tasks.docker`). Nothing here knows a model: the agent evaluation plugs one in."""
