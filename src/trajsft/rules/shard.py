"""Rule ``shard`` (rules/data.smk): a raw artifact transformed, checked and split -> a ``shards`` artifact, its
skipped rows listed next to its manifest."""

from trajsft import io, rule_job
from trajsft.data.shard import shard
from trajsft.plan import step_configs


def run(job, snakemake) -> dict:
    cfg = step_configs.shard(job.plan, job.name)
    result = rule_job.build(job, cfg, shard)
    if result["payload_from"] != "built":  # found sealed (here or under another root): its listing beside the manifest
        src = io.join(cfg.location, "skipped.jsonl")
        if str(cfg.skipped_list) != src:
            io.write_bytes(cfg.skipped_list, io.read_bytes(src))
    return result


ENTRY = rule_job.Entry(run)

if __name__ == "__main__":
    rule_job.run_rule(snakemake, ENTRY)  # noqa: F821 (injected by Snakemake)
