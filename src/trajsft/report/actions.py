"""Next-action scores: the student's turn against the teacher's, on held-out chats.

For each held-out chat of a teacher (the validation split of its shard set), each assistant turn is a candidate; a
deterministic sample of them (by a hash of the chat's ``traj_id`` and the turn's index, capped by ``max_turns``) is
scored. The model gets the conversation up to the turn, rendered with the template training uses, and generates
once (greedy, up to ``max_tokens``). Its output is parsed as ``trajsft serve`` parses it
(:func:`trajsft.data.turns.parse_output`) and compared with the teacher's turn:

- ``valid``: the output parses (every ``<tool_call>`` a JSON object with a name, none left open) and the model ended
  its turn before the token cap;
- ``tool_or_text``: both call a tool, or both answer in text;
- ``tool_name`` (turns where the teacher calls a tool): the student makes as many calls, each of the teacher's tool
  at its position;
- ``arguments_exact`` (same turns): as many calls, each with the teacher's arguments at its position, as JSON objects;
- ``command_program`` and ``command_similarity`` (turns where a teacher's call runs a shell command: a ``command`` or
  ``cmd`` argument): each such command's program (first word) is that of the student's call at its position, and the
  mean of the commands' normalised edit similarity (whitespace collapsed, difflib's ratio; 0 without a command); a
  call the student adds beyond the teacher's counts as a miss;
- ``ends_episode``: both end the episode or both go on (a turn ends it when it calls no tool, or one of its calls
  submits: ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``, mini-swe-agent's signal);
- ``tokens``: the mean tokens generated (not an agreement: no upper bound).

Every prompt renders with the teacher's tools (the block the student trained with: ``Turn.tools``). A turn whose
prompt leaves the student no room to generate (its ``seq_len`` filled) is skipped and counted (``skipped_no_room``),
not scored. An output that does not parse is counted (``valid`` 0, and ``unparsed``), never an error. Two built-in models prove
the scores honest: :class:`Replay` answers with the teacher's own turn as the template renders it (no token cap),
which must score 1.0 on every agreement; :class:`ConstantText` answers every turn with the same text.

Rule ``eval_actions`` (:func:`eval_actions`) scores a target's trained student with its settings (``actions:``) and
writes ``actions.json`` under ``<storage_root>/evals/<target>-<hash>/``, its figures also in
``evals/<target>/done``; ``trajsft eval --actions`` prints them.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import html as _html
import json
import logging
import re
import shlex
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Optional, Protocol, Sequence

from .. import io
from ..data.export import read_split, shard_files
from ..data.template import load_template
from ..data.turns import Parsed, command, parse_message, parse_output
from ..errors import DataError
from ..plan.step_configs import EvalActionsConfig

log = logging.getLogger("trajsft")

RESULTS = "actions.json"  # the payload of an evals artifact
SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
AGREEMENTS = ("valid", "tool_or_text", "tool_name", "arguments_exact", "command_program", "command_similarity",
              "ends_episode")


@dataclass(frozen=True)
class Turn:
    """One scored turn: the conversation before it and the teacher's assistant message."""

    teacher: str
    traj_id: str
    index: int  # the assistant message's index in the chat
    context: tuple[dict, ...]
    reference: dict
    tools: Optional[tuple[dict, ...]] = None  # the tools the prompt renders with (the block the student trained with)


def held_out_turns(teacher: str, shards_location: str, max_turns: int,
                   tools: Optional[Sequence[dict]] = None) -> list[Turn]:
    """The sampled assistant turns of ``teacher``'s held-out chats (the shard set's validation split), each to be
    prompted with ``tools``."""
    files = shard_files(shards_location).get("validation") or []
    chats = read_split(shards_location, files) if files else []
    if not chats:
        raise DataError(f"{teacher}: the held-out split is empty ({shards_location} has no validation chats): set "
                        f"teachers.{teacher}.transform.heldout_fraction (or eval.heldout_fraction) above 0")
    turns = []
    for chat in chats:
        msgs = chat["messages"]
        for i, m in enumerate(msgs):
            if m["role"] == "assistant":
                turns.append(Turn(teacher, str(chat["traj_id"]), i, tuple(msgs[:i]), m,
                                  tuple(tools) if tools else None))

    def key(t: Turn) -> str:
        return hashlib.sha256(f"{t.traj_id}:{t.index}".encode()).hexdigest()

    return sorted(turns, key=key)[:max_turns]


def prompt_text(tokenizer, turn: Turn) -> str:
    """The conversation before the turn, rendered as training renders it (its tools block included), the
    assistant's turn opened."""
    return tokenizer.apply_chat_template(list(turn.context), tools=list(turn.tools) if turn.tools else None,
                                         chat_template=load_template(), tokenize=False, add_generation_prompt=True)


class Model(Protocol):
    name: str

    def answer(self, turns: Sequence[Turn]) -> list[Optional[tuple[str, bool, int]]]:
        """Each turn's output text, whether the model ended its turn, and the tokens it generated; None for a turn
        whose prompt leaves the model no room to generate (skipped, counted)."""


class Replay:
    """The teacher's own turn, rendered by the template from the held-out chat (what the student trained to say)."""

    name = "replay"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def answer(self, turns: Sequence[Turn]) -> list[tuple[str, bool, int]]:
        out = []
        for t in turns:
            before = prompt_text(self.tokenizer, t)
            full = self.tokenizer.apply_chat_template([*t.context, t.reference], chat_template=load_template(),
                                                      tools=list(t.tools) if t.tools else None, tokenize=False)
            if not full.startswith(before):
                raise DataError(f"{t.teacher}/{t.traj_id} turn {t.index}: the template renders the turn's context "
                                "differently with the turn after it")
            text = full[len(before):].rstrip("\n").removesuffix("<|im_end|>")
            out.append((text, True, len(self.tokenizer.encode(text, add_special_tokens=False))))
        return out


class ConstantText:
    """The same text for every turn: a model that never acts."""

    name = "constant-text"

    def __init__(self, text: str = "I am done."):
        self.text = text

    def answer(self, turns: Sequence[Turn]) -> list[tuple[str, bool, int]]:
        return [(self.text, True, 1) for _ in turns]


class Student:
    """A trained model through the engine ``trajsft serve`` uses (:mod:`trajsft.train.generate`), greedy."""

    def __init__(self, name: str, loaded, max_tokens: int):
        self.name, self.loaded, self.max_tokens = name, loaded, max_tokens

    def answer(self, turns: Sequence[Turn]) -> list[Optional[tuple[str, bool, int]]]:
        from ..train import generate

        tok = self.loaded.tokenizer
        prompts = [tok.encode(prompt_text(tok, t), add_special_tokens=False) for t in turns]
        room = [generate.room(self.loaded, p) > 0 for p in prompts]
        outputs = iter(generate.generate(self.loaded, [p for p, r in zip(prompts, room) if r], self.max_tokens))
        out: list[Optional[tuple[str, bool, int]]] = []
        for fits in room:
            if not fits:  # the prompt fills the student's seq_len: nothing to generate
                out.append(None)
                continue
            toks, ended = next(outputs)
            out.append((tok.decode(toks, skip_special_tokens=True), ended, len(toks) + (1 if ended else 0)))
        return out


def _program(cmd: str) -> str:
    try:
        words = shlex.split(cmd)
    except ValueError:
        words = cmd.split()
    return words[0] if words else ""


def _normal(cmd: str) -> str:
    return " ".join(cmd.split())


def ends_episode(p: Parsed) -> bool:
    if not p.calls:
        return True
    return any(c.name == "submit" or SUBMIT in (command(c) or "") for c in p.calls)


def score(student: Parsed, ended: bool, teacher: Parsed) -> dict[str, Optional[float]]:
    """One turn's metrics (None: not applicable to this teacher turn). Every tool call counts, matched by position:
    ``tool_name`` and ``arguments_exact`` hold when the student makes as many calls as the teacher, each with the
    same name (arguments); over the teacher's shell commands, ``command_program`` holds when each is matched by the
    student's call at its position running the same program, and ``command_similarity`` is the mean of difflib's
    ratio per command. A call the student adds beyond the teacher's counts as a miss in both."""
    s_calls, t_calls = student.calls, teacher.calls
    out: dict[str, Optional[float]] = {
        "valid": float(student.parsed and ended),
        "tool_or_text": float(bool(s_calls) == bool(t_calls)),
        "tool_name": None, "arguments_exact": None, "command_program": None, "command_similarity": None,
        "ends_episode": float(ends_episode(student) == ends_episode(teacher)),
    }
    if not t_calls:
        return out
    pairs = list(itertools.zip_longest(s_calls, t_calls))  # (student's, teacher's) by position; None past the shorter
    out["tool_name"] = float(all(s is not None and t is not None and s.name == t.name for s, t in pairs))
    out["arguments_exact"] = float(all(s is not None and t is not None and s.arguments == t.arguments for s, t in pairs))
    if any(command(t) is not None for t in t_calls):
        programs, ratios = [], []
        for s, t in pairs:
            t_cmd = command(t) if t is not None else None
            if t is not None and t_cmd is None:  # a teacher call that runs no command: not a command to match
                continue
            s_cmd = command(s) if s is not None else None
            if t_cmd is None or s_cmd is None:  # a call the student added, or a command it did not run
                programs.append(False)
                ratios.append(0.0)
                continue
            programs.append(_program(s_cmd) == _program(t_cmd))
            ratios.append(difflib.SequenceMatcher(None, _normal(s_cmd), _normal(t_cmd)).ratio())
        out["command_program"] = float(all(programs))
        out["command_similarity"] = sum(ratios) / len(ratios)
    return out


NO_ROOM = "no_room"  # a turn whose prompt fills the student's seq_len: skipped, counted


def answered(turn: Turn, answer: Optional[tuple[str, bool, int]]) -> dict:
    """One scored turn: the model's output, whether it ended its turn, its tokens and its metrics against the
    teacher's (what a chat's record holds and the side-by-side file shows); a turn the model had no room to answer
    (``answer`` None): skipped, with the reason."""
    if answer is None:
        return {"index": turn.index, "skipped": NO_ROOM}
    text, ended, tokens = answer
    student = parse_output(text)
    return {"index": turn.index, "output": text, "ended": ended, "tokens": tokens, "unparsed": not student.parsed,
            "metrics": score(student, ended, parse_message(turn.reference))}


def figures(records: Sequence[Mapping]) -> dict:
    """A split's figures from its scored turns: turns scored, the mean of each metric over the turns it applies to
    (with that count), unparsed outputs, mean tokens generated, and the turns skipped for no room to generate."""
    skipped = sum(1 for r in records if r.get("skipped") == NO_ROOM)
    records = [r for r in records if not r.get("skipped")]
    sums: dict[str, float] = {k: 0.0 for k in AGREEMENTS}
    counts: dict[str, int] = {k: 0 for k in AGREEMENTS}
    for r in records:
        for k, v in r["metrics"].items():
            if v is not None:
                sums[k] += v
                counts[k] += 1
    n = len(records)
    return {"turns": n, **{k: (sums[k] / counts[k] if counts[k] else None) for k in AGREEMENTS},
            "applies_to": {k: counts[k] for k in AGREEMENTS if k not in ("valid", "tool_or_text", "ends_episode")},
            "unparsed": sum(bool(r["unparsed"]) for r in records),
            "tokens": sum(r["tokens"] for r in records) / n if n else None, "skipped_no_room": skipped}


def evaluate(model: Model, turns: Sequence[Turn]) -> dict:
    """The split's figures (:func:`figures`) of ``model``'s answers to ``turns``."""
    return figures([answered(t, a) for t, a in zip(turns, model.answer(turns), strict=True)])


def table(rows: Mapping[str, Mapping[str, Mapping]], metrics: Iterable[str] = ("valid", "tool_name", "tool_or_text",
                                                                              "command_similarity")) -> str:
    """A student x teacher table per metric (rows: models, columns: held-out teacher splits)."""
    metrics = list(metrics)
    cols = list(dict.fromkeys(c for r in rows.values() for c in r))
    lines = []
    for m in metrics:
        lines.append(f"{m}:")
        lines.append("  " + "".join(f"{c:>18}" for c in ["model", *cols]))
        for name, splits in rows.items():
            cells = [("-" if splits.get(c, {}).get(m) is None else f"{splits[c][m]:.3f}") for c in cols]
            lines.append("  " + "".join(f"{x:>18}" for x in [name, *cells]))
    return "\n".join(lines)


def scores(model: Model, turns: Mapping[str, Sequence[Turn]]) -> dict[str, dict]:
    """Each teacher split's figures (:func:`evaluate`)."""
    return {teacher: evaluate(model, ts) for teacher, ts in turns.items()}


def sampled(held_out: Mapping[str, str], max_turns: int,
            tools: Optional[Mapping[str, Optional[Sequence[dict]]]] = None) -> dict[str, list[Turn]]:
    """Each teacher's sampled held-out turns, prompted with ``tools[teacher]`` (an empty split: one line naming the
    setting to change)."""
    return {teacher: held_out_turns(teacher, location, max_turns, (tools or {}).get(teacher))
            for teacher, location in held_out.items()}


CHATS = "chats"  # <location>/chats/<key>.json: one chat's scored turns, written as soon as they are scored
SIDE_BY_SIDE = "side_by_side.md"  # the first scored turns of each split: context tail, teacher, student
SIDE_BY_SIDE_TURNS = 12  # per teacher split


def chat_key(teacher: str, traj_id: str) -> str:
    return hashlib.sha256(f"{teacher}\0{traj_id}".encode()).hexdigest()[:20]


def _stored_chats(location: str) -> dict[str, dict]:
    """The chats already scored at ``location`` (by an earlier, interrupted attempt of the same evaluation)."""
    out = {}
    for path in io.glob(io.join(location, CHATS, "*.json")):
        try:
            rec = io.read_json(path)
        except (ValueError, OSError):  # unreadable: scored again
            continue
        out[chat_key(rec["teacher"], rec["traj_id"])] = rec
    return out


def score_chats(make_model: Callable[[], Model], turns: Mapping[str, Sequence[Turn]], location: str,
                batch: Callable[[Model], int] = lambda m: 1 << 30) -> tuple[dict[str, list[dict]], dict]:
    """Every sampled turn scored, chat by chat: a chat's record goes to ``<location>/chats/`` as soon as all its turns
    are answered, and a chat already recorded there is not asked again (an interrupted evaluation reruns only the
    missing chats; the model is not even loaded when none is missing). Turns are answered ``batch(model)`` at a
    time (the engine's sequences). Returns each teacher's scored turns in sampled order, and the chat counts."""
    chats: dict[str, list[Turn]] = {}
    for teacher, ts in turns.items():
        for t in ts:
            chats.setdefault(chat_key(teacher, t.traj_id), []).append(t)
    stored = _stored_chats(location)
    todo = {k: ts for k, ts in chats.items() if k not in stored}
    counts = {"chats": len(chats), "chats_scored": len(todo), "chats_reused": len(chats) - len(todo)}
    if counts["chats_reused"]:
        log.info("next actions: %d of %d chat(s) found scored by an earlier attempt at %s", counts["chats_reused"],
                 len(chats), location)
    if todo:
        model = make_model()
        flat = [t for ts in todo.values() for t in ts]
        done: dict[tuple[str, str, int], dict] = {}
        size = max(1, batch(model))
        for start in range(0, len(flat), size):
            chunk = flat[start:start + size]
            for t, a in zip(chunk, model.answer(chunk), strict=True):
                done[(t.teacher, t.traj_id, t.index)] = answered(t, a)
            for k, ts in list(todo.items()):
                if all((t.teacher, t.traj_id, t.index) in done for t in ts):
                    rec = {"teacher": ts[0].teacher, "traj_id": ts[0].traj_id,
                           "turns": [done[(t.teacher, t.traj_id, t.index)] for t in ts]}
                    io.write_json(io.join(location, CHATS, f"{k}.json"), rec)
                    stored[k] = rec
                    del todo[k]
    by_turn = {(k, r["index"]): r for k in chats for r in stored[k]["turns"]}
    records = {teacher: [by_turn[(chat_key(teacher, t.traj_id), t.index)] for t in ts] for teacher, ts in turns.items()}
    return records, counts


STEPS = "steps"  # <location>/steps/step-<N>/: the scores of the run's HF export at step N (trajsft eval --watch)


def eval_actions(cfg: EvalActionsConfig, model: Optional[Model] = None) -> dict:
    """Rule ``eval_actions``: the target's trained student (its run's newest model) on each scored teacher's held-out
    turns, greedily through the engine ``trajsft serve`` uses (``model``: another model, for a test); each chat's
    scored turns stream to ``chats/`` (a rerun scores only the missing chats), the figures go to ``actions.json``
    and the result, the first turns of each split side by side to ``side_by_side.md``."""
    if model is not None:
        return _evaluate(cfg, cfg.location, model.name, None, lambda: model, lambda m: 1 << 30)
    from .trained import locate

    return evaluate_trained(cfg, locate(cfg.train), cfg.location)


def evaluate_trained(cfg: EvalActionsConfig, trained, location: str) -> dict:
    """The student ``trained`` (:class:`trajsft.report.trained.Trained`: one model of the target's run) scored as
    :func:`eval_actions` scores, its files under ``location`` (the model loads only when a chat is left to score,
    after the held-out turns are read: an empty split fails in seconds)."""

    def make_model() -> Model:
        from ..train import generate

        return Student(trained.name, generate.load(trained.train_cfg, trained.source, cfg.max_seqs), cfg.max_tokens)

    return _evaluate(cfg, location, trained.name, trained.source, make_model, lambda m: m.loaded.engine_cfg.max_seqs)


def step_location(cfg: EvalActionsConfig, step: int) -> str:
    return io.join(cfg.location, STEPS, f"step-{step}")


def evaluated_steps(location: str, results: str = RESULTS) -> dict[int, dict]:
    """The per-step figures under an evaluation's ``location`` (``steps/step-<N>/<results>``: the scores'
    ``actions.json``, an agent evaluation's ``results.json``), by step."""
    out = {}
    for path in io.glob(io.join(location, STEPS, "step-*", results)):
        try:
            step = int(path.rstrip("/").split("/")[-2].removeprefix("step-"))
            out[step] = io.read_json(path)
        except (ValueError, OSError):
            continue
    return dict(sorted(out.items()))


def _evaluate(cfg: EvalActionsConfig, location: str, name: str, source: Optional[dict],
              make_model: Callable[[], Model], batch: Callable[[Model], int]) -> dict:
    turns = sampled(cfg.held_out, cfg.max_turns, cfg.tools)
    records, counts = score_chats(make_model, turns, location, batch)
    result = {"target": cfg.target, "model": name, "source": source, "max_turns": cfg.max_turns,
              "max_tokens": cfg.max_tokens, "splits": {t: figures(rs) for t, rs in records.items()}}
    if source is not None and source.get("kind") == "hf_export":
        result["step"] = source["step"]
    io.write_json(io.join(location, RESULTS), result)
    io.write_text(io.join(location, SIDE_BY_SIDE), side_by_side(turns, records, name))
    return {**result, **counts, "side_by_side": io.join(location, SIDE_BY_SIDE)}


def _message_text(m: Mapping, limit: int) -> str:
    """A message as the side-by-side file shows it: its text, then each tool call as ``name(arguments)``."""
    parts = [str(m.get("content") or "")]
    for c in m.get("tool_calls") or []:
        f = c.get("function") or c
        args = f.get("arguments")
        parts.append(f"{f.get('name')}({args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)})")
    text = "\n".join(p for p in parts if p).strip()
    return text if len(text) <= limit else text[:limit] + f" ... [{len(text) - limit} more characters]"


def _fence(text: str) -> str:
    ticks = "`" * max(3, 1 + max((len(r) for r in re.findall(r"`+", text)), default=0))
    return f"{ticks}\n{text}\n{ticks}"


def side_by_side(turns: Mapping[str, Sequence[Turn]], records: Mapping[str, Sequence[Mapping]], model: str,
                 first: int = SIDE_BY_SIDE_TURNS, context: int = 2, limit: int = 1500) -> str:
    """The first ``first`` scored turns of each teacher split, readable: the last ``context`` messages before the
    turn, the teacher's turn, the student's, and the turn's metrics."""
    out = [f"# Next actions of {model}: the student's turn beside the teacher's", ""]
    for teacher, ts in turns.items():
        out += [f"## {teacher}: the first {min(first, len(ts))} of {len(ts)} scored turns", ""]
        for t, r in list(zip(ts, records[teacher]))[:first]:
            out += [f"### {t.traj_id}, turn {t.index}", ""]
            for m in t.context[-context:]:
                out += [f"**{m['role']}** (context)", "", _fence(_message_text(m, limit)), ""]
            out += ["**teacher**", "", _fence(_message_text(t.reference, limit)), ""]
            if r.get("skipped"):
                out += ["**student**: not asked: the prompt fills the student's seq_len (skipped, counted)", ""]
                continue
            ended = "" if r["ended"] else " (cut at the token cap)"
            out += [f"**student**{ended}", "", _fence(r["output"][:limit]), ""]
            shown = ", ".join(f"{k} {v:.2f}" for k, v in r["metrics"].items() if v is not None)
            out += [f"{shown}; {r['tokens']} tokens", ""]
    return "\n".join(out)


COLUMNS = ("turns", *AGREEMENTS, "tokens", "unparsed", "skipped_no_room")


def render_html(results: Sequence[Mapping]) -> str:
    """The report's table: one row per (target's student, held-out teacher split), one column per figure."""
    esc = _html.escape
    cell = lambda v: "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))  # noqa: E731
    def label(r: Mapping) -> str:  # a watched export's row says its step; the final evaluation's its model's
        step = r.get("step")
        return f'{esc(r["model"])}, {"final" if r.get("final") else "export"}{"" if step is None else f" step {step}"}'

    body = [f'<tr><th class="row">{esc(r["target"])}<br><span class="tok">{label(r)}</span></th>'
            f"<th>{esc(teacher)}</th>" + "".join(f"<td>{cell(split.get(k))}</td>" for k in COLUMNS) + "</tr>"
            for r in results for teacher, split in r["splits"].items()]
    settings = sorted({(r["max_turns"], r["max_tokens"]) for r in results})
    css = ("body{font-family:sans-serif;font-size:13px}table{border-collapse:collapse}"
           "td,th{border:1px solid #bbb;padding:4px 8px;text-align:right}.tok{color:#666;font-size:11px}"
           "caption{font-weight:bold;margin-bottom:4px}")
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>trajsft next-action scores"
            f"</title><style>{css}</style></head><body>\n<table id=\"actions\"><caption>Next-action scores: each "
            "target's student against the teacher's turn, per held-out teacher split (greedy)</caption>\n"
            "<thead><tr><th>target (model)</th><th>held-out split</th>"
            + "".join(f"<th>{esc(k)}</th>" for k in COLUMNS) + "</tr></thead>\n<tbody>\n" + "\n".join(body)
            + "\n</tbody></table>\n<p>Agreements are means over the turns each applies to (tool_name and "
            "arguments_exact: turns where the teacher calls a tool; command_*: where its call runs a shell command); "
            "tokens is the mean generated. Settings (max_turns, max_tokens): "
            + ", ".join(f"({a}, {b})" for a, b in settings) + ".</p>\n</body></html>\n")


def rule_actions(snakemake) -> None:
    """Rule report_actions: the report's table of every evaluated target's next-action scores: a row per HF export
    ``trajsft eval --actions --watch`` scored while it trained (by step), then its final evaluation."""
    results = []
    for p in snakemake.input:
        final = io.read_json(p)
        results += list(evaluated_steps(final["location"]).values()) if final.get("location") else []
        results.append({**final, "final": True})
    io.write_text(snakemake.output.html, render_html(results))
    io.write_json(snakemake.output.json, [{**{k: r[k] for k in ("target", "model", "max_turns", "max_tokens", "splits")},
                                           "step": r.get("step"), "final": bool(r.get("final"))} for r in results])
    log.info("next-action scores of %d target(s), %d row(s), written to %s", len(snakemake.input), len(results),
             snakemake.output.html)
