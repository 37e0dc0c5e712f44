"""``trajsft serve``: a trained target behind an OpenAI-compatible API (``/v1/chat/completions``, ``/v1/models``).

The engine is Levanter's (``levanter.inference``: its paged-attention ``InferenceEngine`` and the
``InferenceContext`` that batches requests for it, single host); the model is loaded as the cross-teacher matrix
loads it (:func:`trajsft.train.eval.load_model`) from the run's newest model or its HF export at a step; the chat
route is ours (:mod:`trajsft.serve.chat`): requests render with trajsft's template, tools included, and tool calls
come back as ``tool_calls``.

:func:`trajsft.report.trained.locate` (no jax) finds what to serve and says in one line why it cannot; :func:`serve` loads, compiles
once, prints the URL, the model name and where the start-up time went, and serves until SIGINT/SIGTERM.
(No ``from __future__ import annotations`` here: FastAPI reads the routes' annotations, ``Request`` included.)
"""


import asyncio
import contextlib
import json
import logging
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Iterator

from ..errors import ConfigError, one_line
from ..report.trained import Trained
from ..train.generate import END_OF_TURN, end_turn
from . import chat

log = logging.getLogger("trajsft")

DEFAULT_MAX_TOKENS = 512  # a reply's tokens when the request sets no max_tokens (within the student's seq_len)


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything loads (a busy port: one line, at once)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e} (another server there? choose --port)") from None
    sock.listen(128)
    return sock


def _error(status: int, message: str, kind: str = "invalid_request_error", *, param=None, code=None):
    """OpenAI's error object (``message``, ``type``, ``param``, ``code``), and one line in the server's log."""
    from fastapi.responses import JSONResponse

    log.warning("chat completion rejected (%d): %s", status, message)
    return JSONResponse(status_code=status,
                        content={"error": {"message": message, "type": kind, "param": param, "code": code}})


def create_app(served: Trained, tokenizer, submit: Callable, max_seq_len: int, max_seqs: int, *,
               request_log: int = logging.INFO):
    """The FastAPI app: ``/health``, ``/v1/models`` and ``/v1/chat/completions``. ``submit(prompt, max_tokens,
    temperature, seed, n, user=)`` awaits the engine's generations (``InferenceResponse`` objects); each request is
    logged at ``request_log`` (an agent evaluation's many: DEBUG)."""
    from fastapi import FastAPI, Request

    app = FastAPI(title=f"trajsft serve {served.target}")
    end = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    names = (served.name, served.target)
    said: set[str] = set()  # the request tool sets already said to differ from the trained ones (one line each)

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": served.name}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": served.name, "object": "model", "created": 0, "owned_by": "trajsft"}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the request body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "the request body is not a JSON object")
        model = body.get("model")
        if model not in names:
            return _error(404, f"The model {model!r} does not exist: this server serves {served.name}, also "
                               f"called {served.target}", param="model", code="model_not_found")
        try:
            msgs, tool_list = chat.messages(body), chat.tools(body)
            gen = chat.generation_settings(body, DEFAULT_MAX_TOKENS)
            prompt = chat.render(tokenizer, msgs, tool_list)
            if len(prompt) >= max_seq_len:
                raise chat.context_length_exceeded(len(prompt), max_seq_len)
            if gen["n"] > max_seqs:
                raise chat.BadRequest(f"n is {gen['n']}: this server generates at most {max_seqs} at once (--max-seqs)",
                                      param="n")
        except chat.BadRequest as e:
            return _error(400, str(e), param=e.param, code=e.code)
        except Exception as e:  # noqa: BLE001 - a request the checks above missed: one line, never a traceback
            return _error(500, f"the request could not be read: {one_line(e)}", "server_error")
        if (line := chat.tools_mismatch(tool_list, served.tools)) and (key := json.dumps(tool_list)) not in said:
            said.add(key)
            log.warning("%s", line)
        max_tokens = min(gen["max_tokens"], max_seq_len - len(prompt))
        started = time.time()
        try:  # `user` (OpenAI's end-user id) names an agent's episode: the replay model answers by it
            results = await submit(prompt, max_tokens, gen["temperature"], gen["seed"], gen["n"],
                                   user=body.get("user") if isinstance(body.get("user"), str) else None)
        except Exception as e:  # noqa: BLE001 - the engine failed this request: said, and the server goes on
            log.error("chat completion failed: %s", one_line(e))
            return _error(500, f"generation failed: {one_line(e)}", "server_error")
        choices, generated = [], 0
        for i, r in enumerate(results):
            toks, ended = end_turn(r.tokens, end, max_tokens)
            text = tokenizer.decode(toks, skip_special_tokens=True)
            message, finish = chat.assistant_message(text, ended=ended, stops=gen["stop"])
            choices.append({"index": i, "message": message, "finish_reason": finish, "logprobs": None})
            generated += len(r.tokens)
        log.log(request_log, "chat completion: %d prompt tokens, %d generated in %.2fs (%s)", len(prompt), generated,
                time.time() - started, ", ".join(c["finish_reason"] for c in choices))
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
                "model": served.name, "choices": choices,
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": generated,
                          "total_tokens": len(prompt) + generated}}

    return app


@dataclass
class Engine:
    """A loaded student behind Levanter's engine: its tokenizer, ``submit`` (what the chat route awaits), its
    context (``max_seq_len``) and where the start-up time went."""

    tokenizer: object
    submit: Callable
    max_seq_len: int
    seconds: dict
    # how busy the engine was since it was ready: batches generated, the sequences in them (mean per batch over
    # max_seqs: its occupancy) and the seconds spent generating
    stats: dict = field(default_factory=dict)


def _context():
    """Levanter's ``InferenceContext`` (its request and batch threads), each batch counted in ``stats``, and the
    batches queued while the engine was busy merged into the next one it runs, up to ``max_seqs`` sequences and the
    engine's token budget. Levanter forms a batch of the requests that arrive within 0.1 s, as they arrive, then runs
    the batches one after the other: clients whose requests come while a batch generates (an agent's episodes, each
    between two commands) would each get a batch of their own, the engine mostly empty."""
    import queue

    from levanter.inference.openai import InferenceBatch, InferenceContext

    class Batching(InferenceContext):
        stats: dict

        def _merged(self, batch) -> InferenceBatch:
            waiting = []
            while True:
                try:
                    waiting.append(self.batch_queue.get_nowait())
                except queue.Empty:
                    break
            cfg = self.engine.config
            merged, rest = InferenceBatch(batch), []
            for b in waiting:  # in order: the first that does not fit, and every later one, wait their turn
                if not rest and merged.num_seqs() + b.num_seqs() <= cfg.max_seqs \
                        and merged.total_tokens() + b.total_tokens() <= cfg.page_size * cfg.max_pages:
                    merged.extend(b)
                else:
                    rest.append(b)
            for b in rest:
                self.batch_queue.put(b)
            return merged

        def _execute_batch(self, requests):
            merged = self._merged(requests)
            started = time.monotonic()
            try:
                return super()._execute_batch(merged)
            except Exception as e:  # Levanter's loop fails the futures of the batch it handed us: ours too
                for req in merged[len(requests):]:
                    with contextlib.suppress(Exception):
                        req.future.get_loop().call_soon_threadsafe(req.future.set_exception, e)
                raise
            finally:
                self.stats["batches"] += 1
                self.stats["sequences"] += merged.num_seqs()
                self.stats["busy_s"] += time.monotonic() - started

    return Batching


@contextlib.contextmanager
def engine(served: Trained, max_seqs: int) -> Iterator[Engine]:
    """``served``'s model loaded into Levanter's engine, generation compiled once (the first generation compiles
    prefill and decode, so the first client waits on nothing), shut down on exit."""
    from levanter.inference.openai import InferenceServerConfig

    from ..train import generate

    stats = {"max_seqs": max_seqs, "batches": 0, "sequences": 0, "busy_s": 0.0}
    t0 = time.time()
    loaded = generate.load(served.train_cfg, served.source, max_seqs)
    server_cfg = InferenceServerConfig(trainer=loaded.config.trainer, service=loaded.engine_cfg)
    ctx = _context()(loaded.model, loaded.tokenizer, loaded.engine, server_cfg)
    ctx.stats = stats

    async def submit(prompt, max_tokens, temperature, seed, n, user=None):
        future = asyncio.get_running_loop().create_future()
        ctx.submit_request(prompt_tokens=prompt, max_tokens=max_tokens, temperature=temperature,
                           stop_tokens=[loaded.end], seed=seed, future=future, n_generations=n)
        return await future

    ctx.start()
    try:
        t_loaded = time.time()
        warm = chat.render(loaded.tokenizer, [{"role": "user", "content": "hi"}], None)
        asyncio.run(submit(warm, 2, 0.0, 0, 1))
        seconds = {"build": loaded.seconds["build"], "load": loaded.seconds["load"],
                   "compile": time.time() - t_loaded, "ready": time.time() - t0}
        stats.update(batches=0, sequences=0, busy_s=0.0)  # the warm-up's batch is not the clients'
        yield Engine(loaded.tokenizer, submit, loaded.max_seq_len, seconds, stats)
    finally:
        ctx.shutdown()


@contextlib.contextmanager
def in_thread(app, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """``app`` served by uvicorn in a thread of this process (an agent evaluation's server): its base URL
    (``http://host:port/v1``) once it answers; stopped on exit."""
    import uvicorn

    sock = bind(host, port)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="trajsft-serve", daemon=True)
    thread.start()
    try:
        deadline = time.time() + 60
        while not server.started:
            if not thread.is_alive() or time.time() > deadline:
                raise ConfigError(f"the chat server on {host}:{sock.getsockname()[1]} did not start")
            time.sleep(0.02)
        yield f"http://{host}:{sock.getsockname()[1]}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def serve(served: Trained, *, host: str = "127.0.0.1", port: int = 8701, max_seqs: int = 4,
          out: Callable[[str], None] = print) -> None:
    """Load ``served``'s model, compile generation once, then serve until SIGINT/SIGTERM (uvicorn's own shutdown;
    the caller turns the re-raised KeyboardInterrupt into exit 0)."""
    sock = bind(host, port)
    import uvicorn

    src = served.source
    try:
        with engine(served, max_seqs) as eng:
            app = create_app(served, eng.tokenizer, eng.submit, eng.max_seq_len, max_seqs)
            shown = f"[{host}]" if ":" in host else host
            s = eng.seconds
            out(f"trajsft serve: {served.target} ({src['kind']} step {src['step']}, {src['path']}) at "
                f"http://{shown}:{sock.getsockname()[1]}/v1 as model {served.name}")
            out(f"trajsft serve: ready in {s['ready']:.1f}s (build {s['build']:.1f}s, load {s['load']:.1f}s, "
                f"first compile {s['compile']:.1f}s); Ctrl-C stops it")
            server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
            server.run(sockets=[sock])
    finally:
        sock.close()
