"""Optional: the full cache build through Levanter's Ray cache builder (``--with-cache``)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Sequence


# --------------------------------------------------------------------------------------
# optional: the full Ray cache build
# --------------------------------------------------------------------------------------


def bench_build_chat_cache(records: Sequence[dict], tokenizer_path: str, seq_len: int) -> dict:
    """Time ``trajsft.data.cache.build_chat_cache`` once (jsonl.gz shards -> cache; starts a local Ray)."""
    from trajsft.data import cache as data_cache
    from trajsft.data.template import load_template
    from trajsft.data.transform import ShardWriter

    tmp = tempfile.mkdtemp(prefix="trajsft-bench-")
    try:
        urls = []
        rows = [{"messages": r["messages"], "traj_id": r["traj_id"]} for r in records]
        os.makedirs(os.path.join(tmp, "shards"))

        def put(name: str, data: bytes) -> None:
            Path(tmp, "shards", name).write_bytes(data)
            urls.append(os.path.join(tmp, "shards", name))

        w = ShardWriter("train", put)
        for r in rows:
            w.add(r)
        w.close()
        t0 = time.perf_counter()
        stats = data_cache.build_chat_cache(urls, [], os.path.join(tmp, "cache"), os.path.abspath(tokenizer_path),
                                    load_template(), seq_len=seq_len)
        dt = time.perf_counter() - t0
        tr = stats["train"]
        return {"seconds": dt, "chats": tr["chats"], "tokens": tr["tokens"], "chats_per_s": tr["chats"] / dt,
                "tokens_per_s": tr["tokens"] / dt, "packed_sequences": tr.get("packed_sequences"),
                "tokens_truncated": tr.get("tokens_truncated"), "shards": len(urls)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
