#!/usr/bin/env bash
# Regenerate the pictures and examples the README and docs/ show (needs graphviz's `dot`; the
# status example and the report screenshot need a finished demo run, the screenshot Debian's chromium).
# The examples are copied into the README's blocks; tests/test_docs.py fails when they drift.
#   apt-get install -y graphviz chromium && uv run bash scripts/render_docs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p docs
# the DAG of the demo target and of a mixture, and the rule graph
if command -v dot >/dev/null; then
  snakemake --quiet all --dag dot checkpoints/demo/done | dot -Tpng -Gdpi=110 > docs/dag-demo.png
  snakemake --quiet all --dag dot checkpoints/mix-minimax-gemini/done | dot -Tpng -Gdpi=110 > docs/dag-mixture.png
  snakemake --quiet all --rulegraph dot | dot -Tpng -Gdpi=110 > docs/rulegraph.png
else
  echo "render_docs: no graphviz dot: the DAG pictures are not regenerated" >&2
fi
trajsft plan minimax-m2.5 --profile tpu-east5 --offline > docs/plan-example.txt  # offline: the same text wherever it is rendered
if [ -f checkpoints/demo/done ]; then
  # paths relative to the repo, so the example is the same in every clone
  trajsft status --offline | sed "s#$PWD/##g" > docs/status-example.txt
fi
if [ -f checkpoints/demo/done ] && command -v chromium >/dev/null; then
  snakemake --quiet all --report report.html
  python - <<'PY'
import sys
sys.path.insert(0, "tests")
import chromium
info = chromium.check_snakemake_report("report.html", "docs/report-shots")
assert not info["errors"], info["errors"]
PY
  cp docs/report-shots/landing.png docs/report.png
  cp "docs/report-shots/$(ls docs/report-shots | grep -i teachers | head -n 1)" docs/report-teachers.png 2>/dev/null || true
  rm -rf docs/report-shots
  cp results/cards/demo/card.png docs/card-demo.png
  cp results/curves/demo.png docs/curves-demo.png
fi
python scripts/splice_examples.py
