"""Tasks that grade themselves (issue 68): a task instance in SWE-smith's fields (:mod:`trajsft.tasks.record`), a
sandbox per episode (:mod:`trajsft.tasks.sandbox`: bubblewrap, no network, limits) and the grader
(:mod:`trajsft.tasks.grade`: a patch applied to a fresh copy of the task's repository, its tests run, resolved iff
every FAIL_TO_PASS passes and every PASS_TO_PASS still passes). Nothing here knows a model: the agent evaluation
plugs one in."""
