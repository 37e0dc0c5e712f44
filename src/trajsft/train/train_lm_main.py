"""The ``train_lm`` child process: Levanter's ``train_lm.main`` with its end-of-training hooks run once.

Levanter 1.2.dev1644 runs the forced end-of-training hooks (eval, HF export, checkpointer, ...) in
``Trainer.train`` and, whenever ``config.epoch > 0``, a second time in ``train_lm.main`` on the same
final step. ``train_lm_config_for`` sets ``epoch`` for every single-teacher target (the data is cycled),
so the final HF export (a full model) was written twice and eval ran twice more. And when the last
step falls on a hook's period (e.g. eval every 5 steps, 25 steps), ``Trainer.train`` ran that hook
once as scheduled and again in the forced run. Levanter has no switch for this; our thin layer is a
``Trainer`` subclass, put in ``train_lm``'s namespace, whose ``run_hooks`` skips a forced run for a
step that already had one and, in the forced run of a step whose scheduled run just happened, skips
the periodic hooks (``every > 1``) that already ran at that step. Hooks run every step (the
checkpointer, which decides by itself and must see ``force`` to write the final checkpoint) always
get the forced call. The model config's remat policy is prepared first (:mod:`trajsft.train.remat`).

A local training (``TRAJSFT_SAVE_ON_STOP=1``, set by the local executor) loses nothing to Ctrl-C: the first SIGINT or
SIGTERM after a step asks for a stop, the step under way finishes, a checkpoint of it is saved (Levanter's
checkpointer, forced) and the child exits :data:`STOPPED_EXIT`; the rerun resumes from that step. A second signal, or
one before the first step, stops at once. Not on a slice: its hosts save together or not at all (a preempted host's
peers would wait for it in the checkpointer's broadcast), and a preemption is what ``save_interval_minutes`` bounds.
Everything else is Levanter's.
"""

from __future__ import annotations

if __name__ == "__main__":  # the child process run_training launches
    from .launch import child_prelude

    child_prelude()

import os
import signal
import sys

SAVE_ON_STOP = "TRAJSFT_SAVE_ON_STOP"
STOPPED_EXIT = 130  # a stop asked by a signal, after its checkpoint was saved
RELAYED_S = 10.0  # a signal this soon after the first is the same stop relayed (the terminal's, the launcher's)
_STOP: dict = {"signal": None, "at": 0.0, "stepped": False}


def ask_stop(signum, frame) -> None:
    """SIGINT/SIGTERM: the first after a step asks for a checkpoint and a stop after the step under way; the same
    stop relayed within :data:`RELAYED_S` is ignored, a later one (or one before any step) stops at once."""
    import time

    if _STOP["signal"] is None and _STOP["stepped"]:
        _STOP["signal"], _STOP["at"] = signal.Signals(signum).name, time.monotonic()
        print(f"trajsft: {_STOP['signal']}: saving a checkpoint after the step under way, then stopping",
              file=sys.stderr, flush=True)
        return
    if _STOP["signal"] is not None and time.monotonic() - _STOP["at"] < RELAYED_S:
        return
    raise KeyboardInterrupt


def stop_if_asked(trainer, info) -> None:
    """After a step's hooks: when a stop was asked, save this step's checkpoint (forced) and exit."""
    _STOP["stepped"] = True
    if _STOP["signal"] is None:
        return
    from levanter.checkpoint import Checkpointer

    for hook in trainer.hooks.hooks:
        ck = getattr(getattr(hook.fn, "fn", None), "__self__", None)
        if isinstance(ck, Checkpointer):
            ck.on_step(info, force=True)
            ck.wait_until_finished()
            print(f"trajsft: stopped ({_STOP['signal']}) after step {info.step}: its checkpoint is saved, a rerun "
                  f"resumes from it", file=sys.stderr, flush=True)
            sys.exit(STOPPED_EXIT)
    raise KeyboardInterrupt  # no checkpointer: stop as before


def final_hooks_once(trainer_cls: type) -> type:
    """A subclass of ``trainer_cls`` whose forced hooks run at most once per step."""

    class FinalHooksOnceTrainer(trainer_cls):
        _forced_step = None
        _scheduled_step = None

        def run_hooks(self, info, force: bool = False):
            if not force:
                self._scheduled_step = info.step
                out = super().run_hooks(info, force=force)
                stop_if_asked(self, info)
                return out
            if self._forced_step == info.step:
                # to the train log (Levanter's logging setup leaves other loggers at WARNING)
                print(f"trajsft: end-of-training hooks already ran for step {info.step}; not running them again",
                      file=sys.stderr, flush=True)
                return
            self._forced_step = info.step
            if self._scheduled_step != info.step:
                return super().run_hooks(info, force=force)
            # Levanter's TrainerHooks.run_hooks(force=True), less the periodic hooks that just ran
            for hook in self.hooks.hooks:
                if hook.every > 1 and info.step % hook.every == 0:
                    continue
                hook.fn.on_step(info, force=True)

    FinalHooksOnceTrainer.__name__ = FinalHooksOnceTrainer.__qualname__ = f"FinalHooksOnce{trainer_cls.__name__}"
    return FinalHooksOnceTrainer


def main() -> None:
    # train_lm imported as a module (not run as __main__) so its logger is "levanter.main.train_lm"
    import levanter
    import levanter.main.train_lm as train_lm

    from . import tracking

    tracking.guard_init()  # a refused W&B key: one line and exit tracking.EXIT_CODE, not a traceback
    if os.environ.get(SAVE_ON_STOP) == "1":
        signal.signal(signal.SIGINT, ask_stop)
        signal.signal(signal.SIGTERM, ask_stop)
    train_lm.Trainer = final_hooks_once(train_lm.Trainer)
    levanter.config.main(with_remat_policy(train_lm.main, train_lm.TrainLmConfig))()


def with_remat_policy(train_main, config_cls: type):
    """``train_main`` on its config with the model's remat policy prepared (:func:`trajsft.train.remat.prepare`:
    save_attention saves the attention whatever kernel computes it)."""
    import dataclasses

    from . import remat

    def main_with_policy(config):
        model = remat.prepare(config.model)
        print(f"trajsft: remat {remat.policy_of(model.gradient_checkpointing)} "
              f"({type(model.gradient_checkpointing).__name__})", file=sys.stderr, flush=True)
        return train_main(dataclasses.replace(config, model=model))

    main_with_policy.__annotations__ = {"config": config_cls}  # what levanter.config.main decodes the config as
    return main_with_policy


if __name__ == "__main__":
    main()
