rule download:
    output:
        f"{STATE_DIR}/raw/{{name}}/manifest.json",
    log:
        "logs/download/{name}.log",
    benchmark:
        "benchmarks/download/{name}.tsv"
    threads: job_resources("raw").threads
    resources:
        mem_mb=job_resources("raw").mem_mb,
    params:
        # not hashed, but checked: a changed `rows:` re-runs the download (params rerun trigger)
        rows=checked_setting("raw", "rows"),
        # where the payload lives: another storage root reruns the rule (trajsft.storage copies a
        # sealed payload from the old root, or rebuilds it)
        location=payload_location("raw"),
        step=job_step("download"),
    script:
        "../src/trajsft/rules/download.py"


rule shard:
    input:
        artifact_inputs("shards"),
    output:
        f"{STATE_DIR}/shards/{{name}}/manifest.json",
    log:
        "logs/shard/{name}.log",
    benchmark:
        "benchmarks/shard/{name}.tsv"
    threads: job_resources("shards").threads
    resources:
        mem_mb=job_resources("shards").mem_mb,
    params:
        # not hashed (a successful shard set is the same), but switching strict on must rerun the
        # rule so that it fails on the bad rows of an already built shard set
        strict=checked_setting("shards", "strict"),
        location=payload_location("shards"),
        step=job_step("shard"),
    script:
        "../src/trajsft/rules/shard.py"


rule tokenize:
    input:
        artifact_inputs("tokenized"),  # the shards, and the student's models/ snapshot when it holds the tokenizer
    output:
        f"{STATE_DIR}/tokenized/{{name}}/manifest.json",
    log:
        "logs/tokenize/{name}.log",
    benchmark:
        "benchmarks/tokenize/{name}.tsv"
    threads: job_resources("tokenized").threads
    resources:
        mem_mb=job_resources("tokenized").mem_mb,
    params:
        location=payload_location("tokenized"),
        step=job_step("tokenize"),
    script:
        "../src/trajsft/rules/tokenize.py"
