"""Stand-in W&B server on loopback for tests of the wandb SDK (0.31.x) in online mode.

Copied from ../shared/reference/wandb-stub/ (where try_stub.py and its README say what the SDK sends and what
was measured), with three changes: a run upserted without an entity lands in the viewer's entity ("stub"), as
on W&B; file_stream paths without an entity are read; ``srv.fail`` (an HTTP status) answers every request
with it (an outage), ``srv.fail = None`` ends it.

Answers the GraphQL operations, file_stream posts and upload PUTs that wandb.init / log / finish /
log_artifact / resume make, and records what arrives (run ids, config, history rows, summary, files,
artifacts, every request). Unknown GraphQL operations get {"data": {}} and are listed in state["unknown_ops"].

CLI:        python wandb_stub.py PORT STATE.json [REFUSED_KEY ...]    (PORT 0: pick one; prints it)
In-process: srv = make_server(0, refused={"k" * 40}); threading.Thread(target=srv.serve_forever, daemon=True).start()
            url = f"http://127.0.0.1:{srv.server_port}"; ...; srv.state["runs"]["<run id>"]["history"]
"""
import base64, gzip, json, os, re, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VIEWER_ENTITY = "stub"  # the key's user: the entity of a run upserted without one

# Answers that need no state. Viewer must name a user once log_artifact is used (else AuthenticationError);
# ArtifactType must have "project" (else pydantic ValidationError in log_artifact).
LOOSE_OPS = {"Viewer": {"viewer": {"id": "u1", "entity": "stub", "username": "stub", "email": None, "flags": "{}",
                                   "teams": {"edges": []}}},
             "ServerFeaturesQuery": {"serverInfo": {"features": []}},
             "OrganizationCoreWeaveOrganizationID": {"entity": {"organization": None}},
             "ArtifactType": {"project": {"artifact": None}}}


def _run(st, entity, project, name):
    return st["runs"].setdefault(name, {"entity": entity, "project": project, "config": {}, "history": [],
                                        "summary": {}, "events": 0, "output": [], "files": {}, "exitcode": None,
                                        "upserts": 0})


def _bucket(name, r, resume=False):
    b = {"id": "run-" + name, "name": name, "displayName": name, "description": "", "sweepName": None,
         "config": json.dumps(r["config"]), "historyLineCount": len(r["history"]),
         "project": {"id": "p1", "name": r["project"], "entity": {"id": "e1", "name": r["entity"]}}}
    if resume:  # the SDK resumes only if wandbConfig has a "t" key; it restarts _step at historyTail[0]["_step"]+1
        b.update(summaryMetrics=json.dumps(r["summary"]), logLineCount=len(r["output"]), eventsLineCount=r["events"],
                 historyTail=json.dumps([json.dumps(h) for h in r["history"][-1:]]), eventsTail="[]", tags=[],
                 notes=None, wandbConfig=json.dumps({"t": r["config"].get("_wandb", {}).get("value", {}).get("t", {})}))
    return b


def _file(url, aid, fid):  # artifact file or manifest node
    return {"id": fid, "storagePath": fid, "uploadUrl": url, "uploadHeaders": [], "uploadMultipartUrls": None,
            "artifact": {"id": aid}}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def graphql(self, op, v):
        st, up = self.server.state, f"http://127.0.0.1:{self.server.server_port}/upload"
        if op in LOOSE_OPS:
            return LOOSE_OPS[op]
        if op == "UpsertBucket":  # init, config/tag updates, finish
            r = _run(st, v.get("entity") or VIEWER_ENTITY, v.get("project"), v["name"])
            r["upserts"] += 1
            r["config"] = json.loads(v["config"]) if v.get("config") else r["config"]
            r.update({k: v[w] for k, w in (("group", "groupName"), ("job_type", "jobType")) if v.get(w)})
            return {"upsertBucket": {"bucket": _bucket(v["name"], r), "inserted": r["upserts"] == 1}}
        if op == "RunResumeStatus":  # bucket null: new run; bucket with wandbConfig "t": resume
            r = st["runs"].get(v["name"])
            return {"model": {"id": "p1", "name": v.get("project"), "entity": {"id": "e1", "name": v.get("entity") or VIEWER_ENTITY},
                              "bucket": r and _bucket(v["name"], r, resume=True)}}
        if op == "CreateRunFiles":  # wandb-core crashes on a null answer
            return {"createRunFiles": {"runID": "run-" + v["run"], "uploadHeaders": [], "files": [
                {"name": f, "uploadUrl": f"{up}/run/{v['run']}/{f}"} for f in v["files"]]}}
        if op == "CreateArtifact":  # wandb-core crashes on a null answer
            a, aid = v["input"], f"art{len(st['artifacts'])}"
            st["artifacts"][aid] = {"name": a["artifactCollectionName"], "type": a["artifactTypeName"],
                                    "run": a.get("runName"), "digest": a["digest"], "files": [], "committed": False}
            return {"createArtifact": {"artifact": {"id": aid, "state": "PENDING",
                                                    "artifactSequence": {"latestArtifact": None}}}}
        if op == "CreateArtifactManifest":  # a null answer makes the artifact fail silently (debug-internal.log only)
            aid = v["artifactID"]
            f = _file(f"{up}/artifact/{aid}/wandb_manifest.json", aid, aid + "-manifest")
            return {"createArtifactManifest": {"artifactManifest": {"id": aid, "file": f}}}
        if op == "CreateArtifactFiles":  # wandb-core crashes if a node's "artifact" is null
            fs = v["input"]["artifactFiles"]
            for x in fs:
                st["artifacts"][x["artifactID"]]["files"].append(x["name"])
            return {"createArtifactFiles": {"files": {"edges": [{"node": _file(
                f"{up}/artifact/{x['artifactID']}/{x['name']}", x["artifactID"], f"{x['artifactID']}-{i}")} for i, x in enumerate(fs)]}}}
        if op == "CommitArtifact":
            a = st["artifacts"][v["artifactID"]]
            a["committed"] = True
            return {"commitArtifact": {"artifact": {"id": v["artifactID"], "digest": a["digest"]}}}
        st["unknown_ops"][op] = st["unknown_ops"].get(op, 0) + 1
        return {}

    def file_stream(self, path, j):  # POST /files/<entity>/<project>/<run>/file_stream
        *entity, project, name, _ = path.strip("/").split("/")[1:]
        entity = entity[0] if entity else VIEWER_ENTITY
        r = _run(self.server.state, entity, project, name)
        for fname, f in (j.get("files") or {}).items():
            lines, off = f["content"], f["offset"]
            if fname == "wandb-history.jsonl":
                r["history"][off:off + len(lines)] = [json.loads(x) for x in lines]
            elif fname == "wandb-summary.json":
                r["summary"] = json.loads(lines[-1])
            elif fname == "output.log":
                r["output"][off:off + len(lines)] = lines
            elif fname == "wandb-events.jsonl":
                r["events"] = off + len(lines)
        if j.get("complete"):
            r["exitcode"] = j.get("exitcode")
        return {"exitcode": None, "limits": {}}

    def handle_any(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        st, path, op, code, out = self.server.state, self.path, None, 200, {}
        auth = self.headers.get("Authorization", "")
        key = base64.b64decode(auth[6:]).decode().partition(":")[2] if auth.startswith("Basic ") else None
        with self.server.lock:
            if path.startswith("/graphql"):
                j = json.loads(body or b"{}")  # the Python public API sends operationName "": take it from the query
                op = j.get("operationName") or (re.findall(r"(?:query|mutation)\s+(\w+)", j.get("query", "")) or [""])[0]
            if self.server.fail:  # an outage: every request gets this status
                code, out = self.server.fail, {"errors": [{"message": "stub: unavailable"}]}
            elif not path.startswith("/"):  # absolute URL or CONNECT: something tried to leave loopback via a proxy
                code = 403
            elif path.startswith(("/graphql", "/files/")) and (key is None or key in self.server.refused):
                code, out = 401, {"errors": [{"message": "stub: API key refused"}]}
            elif op:
                st["queries"].setdefault(op, [j.get("query"), j.get("variables")])
                out = {"data": self.graphql(op, j.get("variables") or {})}
            elif path.endswith("/file_stream"):
                out = self.file_stream(path, json.loads(body))
            elif path.startswith("/upload/"):
                st["uploads"][path[len("/upload/"):]] = len(body)
                if path.startswith("/upload/run/"):
                    _, _, _, name, fname = path.split("/", 4)
                    _run(st, None, None, name)["files"][fname] = len(body)
            else:  # e.g. /sdk/otel/v1/metrics (SDK telemetry): not needed
                code = 404
            st["requests"].append([round(time.time() - self.server.t0, 3), self.command, path, op, code])
            if self.server.state_path:
                with open(self.server.state_path + ".tmp", "w") as f:
                    json.dump(st, f)
                os.replace(self.server.state_path + ".tmp", self.server.state_path)
        b = json.dumps(out).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)

    do_GET = do_POST = do_PUT = do_CONNECT = handle_any

    def handle(self):  # the SDK drops keep-alive connections when its process exits
        try:
            super().handle()
        except (ConnectionResetError, BrokenPipeError):
            pass

    def log_message(self, *a):
        pass


def make_server(port=0, refused=(), state_path=None):
    srv = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    srv.refused, srv.state_path, srv.lock, srv.t0 = set(refused), state_path, threading.Lock(), time.time()
    srv.fail = None
    srv.state = {"runs": {}, "artifacts": {}, "uploads": {}, "unknown_ops": {}, "queries": {}, "requests": []}
    return srv


if __name__ == "__main__":
    s = make_server(int(sys.argv[1]), sys.argv[3:], sys.argv[2])
    print(s.server_port, flush=True)
    s.serve_forever()
