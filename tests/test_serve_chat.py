"""The chat route of ``trajsft serve`` without the engine (trajsft.serve.chat, trajsft.report.trained.locate): requests
render with the template training uses, tools included; the student's ``<tool_call>`` output comes back as OpenAI
``tool_calls``; bad requests and unservable targets are one line each. The server itself, driven by the openai
SDK: tests/test_pipeline.py::test_serve_the_demo_to_the_openai_sdk."""

from __future__ import annotations

import json
import shutil

import pytest
from transformers import AutoTokenizer

from trajsft.data.template import load_template
from trajsft.errors import ConfigError
from trajsft.plan import config as C
from trajsft.plan import step_configs
from trajsft.report import trained
from trajsft.plan.tools import BASH
from trajsft.serve import chat, server

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run a command",
                                           "parameters": {"type": "object",
                                                          "properties": {"command": {"type": "string"}}}}}]
HISTORY = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is in the repo?"},
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "Cargo.toml\nsrc"},
]


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(str(C.REPO_DIR / "demo" / "tokenizer"))


def test_a_request_renders_as_training_renders_the_chat_tools_included(tok):
    body = {"messages": HISTORY, "tools": TOOLS}
    ids = chat.render(tok, chat.messages(body), chat.tools(body))
    # the shards' form of the same chat (content "" for a tool-calling turn, arguments as the JSON string given)
    shard_form = [{**m, "content": m["content"] or ""} for m in HISTORY]
    want = tok.apply_chat_template(shard_form, tools=TOOLS, chat_template=load_template(), add_generation_prompt=True,
                                   tokenize=True)
    assert ids == list(want)
    text = tok.decode(ids)
    assert "# Tools" in text and '"name": "bash"' in text  # the tools block of the template
    assert '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>' in text
    assert "<tool_response>\nCargo.toml\nsrc\n</tool_response>" in text and text.endswith("<|im_start|>assistant\n")
    # no tools: the template's plain system turn; OpenAI's text parts and the developer role are read as text
    plain = chat.messages({"messages": [{"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
                                        {"role": "user", "content": "hi"}]})
    assert plain[0] == {"role": "system", "content": "Be brief."} and chat.tools({"tools": []}) is None


@pytest.mark.parametrize("body, message", [
    ({}, "messages: a non-empty list of chat messages is required"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role is 'robot', expected one of system, user, assistant, tool"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content is int, expected a string or a list of text parts"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0]: only text parts are served"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]}, "messages[0].tool_calls[0].function.name is missing"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "retrieval"}]}, "tools[0]: expected"),
])
def test_a_malformed_request_is_one_line_naming_the_field(body, message):
    with pytest.raises(chat.BadRequest) as e:
        chat.tools(body), chat.messages(body)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


@pytest.mark.parametrize("body, message", [
    ({"max_tokens": 0}, "max_tokens is 0, expected an integer >= 1"),
    ({"temperature": -1}, "temperature is -1, expected a number >= 0"),
    ({"temperature": 2.5}, "temperature is 2.5, expected a number >= 0 and <= 2"),
    ({"max_completion_tokens": 0}, "max_completion_tokens is 0, expected an integer >= 1"),
    ({"n": "2"}, 'n is "2", expected an integer >= 1'),
    ({"stream": True}, "stream: streamed responses are not served"),
    ({"stream": "yes"}, "stream: streamed responses are not served"),
    ({"stop": [""]}, 'stop is [""], expected a string or a list of non-empty strings'),
    ({"stop": -7}, "stop is -7, expected a string or a list of non-empty strings"),  # was a 500 and a traceback
    ({"stop": {"a": 1}}, 'stop is {"a": 1}, expected a string or a list'),  # was silently the stop string "a"
    ({"stop": ["a", 3]}, 'stop is ["a", 3], expected a string or a list'),
    ({"seed": "x"}, 'seed is "x", expected a 64-bit integer'),
    ({"seed": 2**64}, "seed is 18446744073709551616, expected a 64-bit integer"),
])
def test_bad_generation_settings_are_one_line(body, message):
    with pytest.raises(chat.BadRequest) as e:
        chat.generation_settings(body, 512)
    assert str(e.value).startswith(message) and e.value.param == next(iter(body)), str(e.value)


def test_generation_settings_default_and_read():
    assert chat.generation_settings({}, 512) == {"max_tokens": 512, "temperature": 0.7, "n": 1, "seed": None, "stop": []}
    got = chat.generation_settings({"max_completion_tokens": 9, "temperature": 0, "seed": 3, "stop": "END"}, 512)
    assert got == {"max_tokens": 9, "temperature": 0.0, "n": 1, "seed": 3, "stop": ["END"]}


def test_tool_calls_in_the_output_come_back_as_openai_tool_calls():
    out = ('<think>\nlook first\n</think>\n\nListing.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}'
           '\n</tool_call>\n<tool_call>\n{"name": "read", "arguments": "{\\"path\\": \\"a\\"}"}\n</tool_call>')
    msg, finish = chat.assistant_message(out, ended=True, stops=[])
    assert finish == "tool_calls" and msg["content"] == "<think>\nlook first\n</think>\n\nListing."
    [a, b] = msg["tool_calls"]
    assert a["type"] == "function" and a["id"].startswith("call_") and a["id"] != b["id"]
    assert a["function"] == {"name": "bash", "arguments": json.dumps({"command": "ls -la"})}
    assert b["function"] == {"name": "read", "arguments": '{"path": "a"}'}  # a JSON string stays as given
    msg, finish = chat.assistant_message('<tool_call>\n{"name": "bash"}\n</tool_call>', ended=True, stops=[])
    assert msg["content"] is None and msg["tool_calls"][0]["function"]["arguments"] == "{}"


@pytest.mark.parametrize("out, ended, finish", [
    ("Done.", True, "stop"),
    ("Do", False, "length"),  # cut by max_tokens
    ('<tool_call>\n{"name": "bash", "arguments": {"command": \n</tool_call>', True, "stop"),  # not JSON
    ('<tool_call>\n["bash"]\n</tool_call>', True, "stop"),  # not an object with a name
    ('<tool_call>\n{"name": "bash"}\n</tool_call><tool_call>\n{"name": ', False, "length"),  # one left open
])
def test_output_that_does_not_parse_comes_back_as_text(out, ended, finish):
    msg, got = chat.assistant_message(out, ended=ended, stops=[])
    assert msg == {"role": "assistant", "content": out} and got == finish


def test_a_stop_string_ends_the_output_before_it():
    msg, finish = chat.assistant_message("one\nTwo END three", ended=False, stops=["END", "\n\n"])
    assert msg["content"] == "one\nTwo " and finish == "stop"


def test_what_cannot_be_served_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = C.Plan(C.load(None, {"storage_root": str(tmp_path / "store")}), base_dir=C.REPO_DIR,
                  state_dir=str(tmp_path / "results"))
    with pytest.raises(ConfigError) as e:
        trained.locate(step_configs.train(plan, "demo"))
    run = plan.get("checkpoints", next(a.name for a in plan.chain("demo") if a.kind == "checkpoints"))
    assert str(e.value) == (f"demo is not trained: no run {run.name} under {tmp_path}/store/checkpoints/{run.name} or "
                            "the other storage roots (train it: snakemake checkpoints/demo/done)")
    with pytest.raises(ConfigError, match=r"^unknown target 'nope'"):
        trained.locate(step_configs.train(plan, "nope"))
    # a run that started: its provenance, no model yet; then an HF export of another architecture at a step
    run_dir = tmp_path / "store/checkpoints" / run.name
    train_cfg = {"model": {"type": "qwen3", "hidden_dim": 64, "num_layers": 2}, "hf_save_path": "elsewhere",
                 "trainer": {"id": run.hash, "checkpointer": {"base_path": "elsewhere"}}}
    (run_dir / "provenance").mkdir(parents=True)
    (run_dir / "provenance/config.json").write_text(json.dumps({"levanter": train_cfg}))
    with pytest.raises(ConfigError, match=rf"^demo is not trained: run {run.name} at {run_dir} has no checkpoint or HF"):
        trained.locate(step_configs.train(plan, "demo"))
    with pytest.raises(ConfigError, match=rf"^demo: run {run.name} has no HF export at step 7 under {run_dir}/hf "
                                          r"\(complete exports at steps: none\)$"):
        trained.locate(step_configs.train(plan, "demo"), 7)
    export = run_dir / "hf/step-7"
    export.mkdir(parents=True)
    (export / "config.json").write_text(json.dumps({"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 28}))
    (export / "model.safetensors").write_bytes(b"x")
    monkeypatch.setattr("trajsft.train.checkpoints.hf_export_complete", lambda path: True)
    with pytest.raises(ConfigError) as e:
        trained.locate(step_configs.train(plan, "demo"), 7)
    assert str(e.value) == (f"{export} is a checkpoint of another architecture than the run's model: num_layers 2 but "
                            "config.json num_hidden_layers 28")
    (export / "config.json").write_text(json.dumps({"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2}))
    served = trained.locate(step_configs.train(plan, "demo"), 7)
    assert served.source == {"kind": "hf_export", "path": str(export), "step": 7} and served.name == run.name
    assert served.tools == ([BASH],)  # what the demo's chats trained with: a request's tools are compared to it
    assert served.train_cfg["trainer"]["checkpointer"]["base_path"] == f"{run_dir}/checkpoints"  # where it was found
    shutil.rmtree(run_dir)


def test_a_busy_port_is_one_line():
    first = server.bind("127.0.0.1", 0)
    try:
        port = first.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"^cannot listen on 127.0.0.1:{port}: .*choose --port\)$"):
            server.bind("127.0.0.1", port)
    finally:
        first.close()


# ---- serve renders what training rendered, and says when a request's tools differ (issue 64) ------------------
def _held_out_demo_chats() -> list[list[dict]]:
    """The demo's held-out chats (its transform's heldout_fraction) as the shards hold them."""
    import pyarrow.parquet as pq

    from trajsft.data import transform as T

    plan = C.Plan(C.load(), base_dir=C.REPO_DIR)
    frac, tools = plan.specs.teachers["demo"].transform.heldout_fraction, [BASH]
    out = []
    for f in sorted((C.REPO_DIR / "demo/dataset/data").glob("*.parquet")):
        for row in pq.read_table(f).to_pylist():
            try:
                msgs, _ = T.normalize_messages(row["messages"], ["exit"], tools)
            except T.BadRow:
                continue
            if T.heldout(row["traj_id"], frac):
                out.append(msgs)
    return out


def test_a_held_out_chats_prompt_as_serve_renders_it_is_the_training_rendering_of_its_prefix(tok):
    """Parity: for each assistant turn of the demo's held-out chats, a request carrying the chat so far and the
    teacher's tools (bash) renders, token for token, as the training ids of the whole chat up to that turn."""
    from trajsft.data.chat_processor import ToolsChatProcessor

    processor = ToolsChatProcessor(tok, load_template(), [BASH])
    chats, turns = _held_out_demo_chats(), 0
    assert len(chats) >= 2
    for msgs in chats:
        [trained_on] = processor([{"messages": msgs}])
        ids, mask = list(trained_on["input_ids"]), list(trained_on["assistant_masks"])
        starts = [i for i in range(1, len(mask)) if mask[i] and not mask[i - 1]]  # each turn's first trained token
        asked = [k for k, m in enumerate(msgs) if m["role"] == "assistant"]
        assert len(starts) == len(asked)
        for k, start in zip(asked, starts):
            body = {"model": "demo", "messages": msgs[:k], "tools": [BASH]}
            prompt = chat.render(tok, chat.messages(body), chat.tools(body))
            assert prompt == ids[:start], (k, tok.decode(prompt[-20:]), tok.decode(ids[start - 20:start]))
            turns += 1
    assert turns >= 5  # every assistant turn of them (8 in the demo)
    # without the tools the prompt is another one: the block is what the student trained with
    bare = chat.render(tok, chat.messages({"messages": chats[0][:2]}), None)
    assert bare != chat.render(tok, chat.messages({"messages": chats[0][:2]}), [BASH])


@pytest.fixture
def http(tok):
    """``server.create_app`` behind uvicorn on a loopback port (real HTTP), over a stand-in ``submit`` that answers
    every request with ``reply`` (the student's output, as tokens); yields ``start(reply, max_seq_len)`` -> the
    base URL."""
    import threading

    import uvicorn

    running = []

    def start(reply: str, max_seq_len: int = 4096) -> str:
        class Out:
            tokens = tok.encode(reply + "<|im_end|>", add_special_tokens=False)

        async def submit(prompt, max_tokens, temperature, seed, n, user=None):
            return [Out()] * n

        served = trained.Trained(target="demo", name="demo-0123456789", run_dir="/r", source={}, train_cfg={},
                                 tools=([BASH],))
        sock = server.bind("127.0.0.1", 0)
        app = server.create_app(served, tok, submit, max_seq_len=max_seq_len, max_seqs=2)
        srv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        t = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
        t.start()
        running.append((srv, t, sock))
        for _ in range(200):
            if srv.started:
                break
            t.join(0.05)
        assert srv.started, "uvicorn did not start"
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"

    yield start
    for srv, t, sock in running:
        srv.should_exit = True
        t.join(10)
        sock.close()


def test_a_tool_call_comes_back_over_http_as_openai_tool_calls(http):
    """The openai SDK against the app over real HTTP: the student's ``<tool_call>`` block is a tool call (its name,
    its arguments a JSON string) with finish_reason "tool_calls", and the text before it the content."""
    import openai

    url = http('<think>\n\n</think>\n\nRunning the tests.\n<tool_call>\n{"name": "bash", "arguments": '
               '{"command": "cargo test -q"}}\n</tool_call>')
    client = openai.OpenAI(base_url=url, api_key="not-needed", max_retries=0, timeout=30)
    r = client.chat.completions.create(model="demo", messages=HISTORY[:2], tools=[BASH], max_tokens=64)
    [choice] = r.choices
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "bash"
    assert json.loads(call.function.arguments) == {"command": "cargo test -q"}
    assert choice.message.content == "<think>\n\n</think>\n\nRunning the tests."
    # and plain text is a stop, not a tool call
    plain = http("All tests pass.")
    r = openai.OpenAI(base_url=plain, api_key="x", max_retries=0).chat.completions.create(model="demo", messages=HISTORY[:2])
    assert (r.choices[0].finish_reason, r.choices[0].message.content, r.choices[0].message.tool_calls) == \
        ("stop", "All tests pass.", None)


def test_errors_are_openais_over_http_and_one_log_line_each(http, tok, caplog):
    """A prompt over the student's context is OpenAI's 400 word for word with code context_length_exceeded (what
    litellm turns into ContextWindowExceededError, so an agent stops instead of retrying); malformed fields are a
    400 naming the field (``stop: -7`` was a 500 with a traceback); an unknown model a 404; each rejected request
    is one line in the server's log, and the server goes on serving."""
    import openai

    url = http("ok", max_seq_len=64)
    client = openai.OpenAI(base_url=url, api_key="not-needed", max_retries=0, timeout=30)
    long = [{"role": "user", "content": "word " * 100}]
    n = len(chat.render(tok, long, None))
    cases = [
        (dict(messages=long), openai.BadRequestError,
         f"This model's maximum context length is 64 tokens. However, your messages resulted in {n} tokens.",
         "messages", "context_length_exceeded"),
        (dict(messages=HISTORY[:1], stop=-7), openai.BadRequestError, "stop is -7, expected", "stop", None),
        (dict(messages=HISTORY[:1], stop={"a": 1}), openai.BadRequestError, 'stop is {"a": 1}, expected', "stop", None),
        (dict(messages=HISTORY[:1], temperature=-1), openai.BadRequestError, "temperature is -1", "temperature", None),
        (dict(messages=[{"role": "robot"}]), openai.BadRequestError, "messages[0].role is 'robot'", "messages", None),
        (dict(messages=HISTORY[:1], model="gpt-4o"), openai.NotFoundError, "The model 'gpt-4o' does not exist", "model",
         "model_not_found"),
    ]
    for kwargs, kind, message, param, code in cases:
        caplog.clear()
        with caplog.at_level("WARNING", logger="trajsft"), pytest.raises(kind) as e:
            client.chat.completions.create(**{"model": "demo", **kwargs})
        err = e.value.body
        assert err["message"].startswith(message) and err["type"] == "invalid_request_error", err
        assert (err["code"], err["param"]) == (code, param), err
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1 and lines[0].startswith("chat completion rejected (") and message in lines[0], lines
    assert e.value.status_code == 404
    r = client.chat.completions.create(model="demo", messages=HISTORY[:1], max_tokens=4)
    assert r.choices[0].message.content == "ok"  # still serving
    assert n > 64 and len(chat.render(tok, HISTORY[:1], None)) < 64


def test_a_request_whose_tools_differ_from_the_trained_ones_is_served_as_asked_with_one_log_line(tok, caplog):
    """Over the app's real route (a stand-in engine): the same tools, no line; other tools, none, or the bash tool
    with its keys in another order are served as asked (the prompt holds what the request sent), one line per
    distinct tool set."""
    from fastapi.testclient import TestClient

    prompts = []

    class Out:
        tokens = tok.encode("ok<|im_end|>", add_special_tokens=False)

    async def submit(prompt, max_tokens, temperature, seed, n, user=None):
        prompts.append(prompt)
        return [Out()]

    served = trained.Trained(target="demo", name="demo-0123456789", run_dir="/r", source={}, train_cfg={},
                             tools=([BASH],))
    client = TestClient(server.create_app(served, tok, submit, max_seq_len=4096, max_seqs=2))
    reordered = [{"function": BASH["function"], "type": "function"}]
    said = []
    for tools in ([BASH], TOOLS, TOOLS, None, reordered, [BASH]):
        caplog.clear()
        with caplog.at_level("WARNING", logger="trajsft"):
            r = client.post("/v1/chat/completions", json={"model": "demo", "messages": HISTORY[:2], "tools": tools})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "ok", r.text
        assert prompts[-1] == chat.render(tok, chat.messages({"messages": HISTORY[:2]}), tools)  # as asked
        said.append([rec.getMessage() for rec in caplog.records if "not the ones the student trained with" in rec.getMessage()])
    assert said[0] == said[2] == said[5] == []  # the trained tools; an other set already said once
    assert said[1] == ["chat completion: the request's tools (bash) are not the ones the student trained with (bash) "
                       "(the same names: their schemas or key order differ): served as asked, so the prompt is not "
                       "one it trained on"]
    assert said[3] == ["chat completion: the request's tools (none) are not the ones the student trained with (bash): "
                       "served as asked, so the prompt is not one it trained on"]
    assert len(said[4]) == 1 and "(the same names: their schemas or key order differ)" in said[4][0]
    assert chat.tools_mismatch(None, (None,)) is None and chat.tools_mismatch([BASH], ()) is None
