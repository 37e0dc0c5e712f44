rule download:
    output:
        f"{STATE_DIR}/raw/{{name}}/manifest.json",
    log:
        "logs/download/{name}.log",
    conda:
        "../envs/trajsft.yaml"
    params:
        # not hashed, but checked: a changed `rows:` re-runs the download (params rerun trigger)
        rows=lambda w: PLAN.get("raw", w.name).spec["rows"],
    script:
        "../scripts/rule_download.py"


rule shard:
    input:
        upstream_manifest("shards", "raw"),
    output:
        f"{STATE_DIR}/shards/{{name}}/manifest.json",
    log:
        "logs/shard/{name}.log",
    benchmark:
        "benchmarks/shard/{name}.tsv"
    conda:
        "../envs/trajsft.yaml"
    params:
        # not hashed (a successful shard set is the same), but switching strict on must rerun the
        # rule so that it fails on the bad rows of an already built shard set
        strict=lambda wildcards: bool(
            PLAN.get("shards", wildcards.name).spec["transform"].get("strict")
        ),
    script:
        "../scripts/rule_shard.py"


rule tokenize:
    input:
        upstream_manifest("tokenized", "shards"),
    output:
        f"{STATE_DIR}/tokenized/{{name}}/manifest.json",
    log:
        "logs/tokenize/{name}.log",
    benchmark:
        "benchmarks/tokenize/{name}.tsv"
    conda:
        "../envs/trajsft.yaml"
    script:
        "../scripts/rule_tokenize.py"
