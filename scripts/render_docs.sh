#!/usr/bin/env bash
# Regenerate the pictures and examples the README shows (needs graphviz's `dot`;
# the report screenshot needs Debian's chromium and a finished demo run).
#   apt-get install -y graphviz chromium && uv run bash scripts/render_docs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p docs
# the DAG of the demo target and of a mixture, and the rule graph
snakemake --quiet all --dag dot checkpoints/demo/done | dot -Tpng -Gdpi=110 > docs/dag-demo.png
snakemake --quiet all --dag dot checkpoints/mix-minimax-gemini/done | dot -Tpng -Gdpi=110 > docs/dag-mixture.png
snakemake --quiet all --rulegraph dot | dot -Tpng -Gdpi=110 > docs/rulegraph.png
trajsft plan minimax-m2.5 --profile tpu-east5 > docs/plan-example.txt
if [ -f checkpoints/demo/done ]; then
  trajsft status --offline > docs/status-example.txt
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
