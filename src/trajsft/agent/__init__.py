"""The agent evaluation: a trained student works a task set's tasks through mini-swe-agent (``harness``), each
episode in the task's sandbox and graded by its tests; the built-in scripted models that prove it honest
(``replay``); the step of rule ``eval_agent`` and ``trajsft eval --agent`` (``evaluate``)."""
