rule download:
    output:
        f"{STATE_DIR}/raw/{{name}}/manifest.json",
    conda:
        "../envs/trajsft.yaml"
    log:
        "logs/download/{name}.log",
    script:
        "../scripts/rule_download.py"


rule shard:
    input:
        upstream_manifest("shards", "raw"),
    output:
        f"{STATE_DIR}/shards/{{name}}/manifest.json",
    conda:
        "../envs/trajsft.yaml"
    log:
        "logs/shard/{name}.log",
    benchmark:
        "benchmarks/shard/{name}.tsv"
    script:
        "../scripts/rule_shard.py"


rule tokenize:
    input:
        upstream_manifest("tokenized", "shards"),
    output:
        f"{STATE_DIR}/tokenized/{{name}}/manifest.json",
    conda:
        "../envs/trajsft.yaml"
    log:
        "logs/tokenize/{name}.log",
    benchmark:
        "benchmarks/tokenize/{name}.tsv"
    script:
        "../scripts/rule_tokenize.py"
