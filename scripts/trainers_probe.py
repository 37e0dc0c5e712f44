"""What LLaMA-Factory and TRL themselves tokenize and train on for trajsft's exports.

Runs INSIDE the trainers' environment (envs/trainers-requirements.txt: llamafactory 0.9.5, trl 0.24.0,
torch 2.11.0, datasets 4.0.0), which has no trajsft; scripts/check_trainers.py builds that
environment, writes the job file and compares what this prints with trajsft's own cache.

    python trainers_probe.py JOB.json OUT.json

JOB.json: {"tokenizer": dir, "work": dir, "datasets": [{"key", "train_args": {...LLaMA-Factory
train_args.yaml...}, "lf_dataset": name, "cutoff_lens": [n, ...], "messages_files": [...],
"sft_config": {...messages/sft_config.json...}}]}

OUT.json: {key: {"llamafactory": {cutoff_len: [{"ids", "trained"}...]}, "trl": [{"ids", "trained"}...]}},
"trained" being the positions whose label is not -100. The rows are in file order.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

os.environ.setdefault("DISABLE_VERSION_CHECK", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
IGNORE = -100


def _trained(labels) -> list[int]:
    return [i for i, x in enumerate(labels) if int(x) != IGNORE]


def llamafactory_rows(tokenizer: str, work: str, train_args: dict, dataset: str, cutoff_len: int) -> list[dict]:
    """LLaMA-Factory's own get_dataset (stage sft) with the exported training arguments; only the
    model (the tokenizer dir), the one dataset, cutoff_len and the output dir are set here."""
    from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_tokenizer

    args = {**train_args, "model_name_or_path": tokenizer, "dataset": dataset, "cutoff_len": cutoff_len,
            "output_dir": os.path.join(work, "lf-out"), "overwrite_cache": True, "report_to": "none"}
    for k in ("eval_dataset", "model_revision"):
        args.pop(k, None)
    args.pop("mix_strategy", None)
    args.pop("interleave_probs", None)
    model_args, data_args, training_args, _, _ = get_train_args(args)
    module = load_tokenizer(model_args)
    template = get_template_and_fix_tokenizer(module["tokenizer"], data_args)
    ds = get_dataset(template, model_args, data_args, training_args, stage="sft", **module)["train_dataset"]
    return [{"ids": [int(x) for x in r["input_ids"]], "trained": _trained(r["labels"])} for r in ds]


def trl_rows(tokenizer: str, work: str, files: list[str], sft_config: dict) -> list[dict]:
    """TRL's own SFTTrainer dataset preparation and collator with the exported SFTConfig arguments
    (a one-layer random Qwen3 model: the trainer needs a model, the data does not depend on it)."""
    import datasets
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM
    from trl import SFTConfig, SFTTrainer

    tok = AutoTokenizer.from_pretrained(tokenizer)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=8))
    ds = datasets.load_dataset("json", data_files=files, split="train")
    # bf16 off and the CPU: this machine's settings, not the data's
    args = SFTConfig(output_dir=os.path.join(work, "trl-out"), report_to=[], bf16=False, use_cpu=True, **sft_config)
    trainer = SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
    out = []
    for row in trainer.train_dataset:
        batch = trainer.data_collator([row])
        out.append({"ids": [int(x) for x in batch["input_ids"][0]], "trained": _trained(batch["labels"][0])})
    return out


def main(job_path: str, out_path: str) -> None:
    job = json.load(open(job_path))
    result = {}
    for d in job["datasets"]:
        lf = {str(n): llamafactory_rows(job["tokenizer"], job["work"], d["train_args"], d["lf_dataset"], n)
              for n in d["cutoff_lens"]}
        result[d["key"]] = {"llamafactory": lf, "trl": trl_rows(job["tokenizer"], job["work"], d["messages_files"],
                                                                d["sft_config"])}
    with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(os.path.abspath(out_path)), delete=False) as f:
        json.dump(result, f)
    os.replace(f.name, out_path)


if __name__ == "__main__":
    main(*sys.argv[1:3])
