#!/usr/bin/env bash
# Download, here (a machine with PyPI), the wheels the GPU run needs and the GPU node lacks, into .whl/
# (git-ignored), and check that they fit what is sent with the source tree. docs/benchmarks.md, "Runbook".
#
# The GPU node (python 3.12, torch 2.11 + CUDA, triton 3.6, numpy, rich, filelock, packaging, pyyaml,
# pytest, einops, scipy, torch-geometric, matplotlib, ...) has no network. It lacks:
#   kernel-probe's own:    tomli-w, archspec
#   the kernel library:    liger-kernel
#   anemoi's processor:    anemoi-models, anemoi-utils, hydra-core, omegaconf, antlr4-python3-runtime
# (the modules `import anemoi.models.layers.processor` loads; anemoi-utils' other dependencies, such as
# pydantic, are not imported on that path). All are pure Python. Versions: the ones CI tests with.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.whl
mkdir -p "$dest"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$dest" \
  liger-kernel==0.8.5 anemoi-models==0.19.0 anemoi-utils==0.5.14 hydra-core==1.3.8 omegaconf==2.3.1 \
  tomli-w==1.2.0 archspec==0.2.7
# antlr4-python3-runtime 4.9.3 (hydra-core pins 4.9.*) is published as a source archive only: build its
# pure-Python wheel here
python3 -m pip wheel -q --no-deps -w "$dest" antlr4-python3-runtime==4.9.3
git check-ignore -q "$dest" || { echo "gpu_wheels.sh: $dest is not git-ignored" >&2; exit 1; }
# what travels: the tracked files, untracked files git does not ignore, and the carried .whl (64 MiB in all)
tree_bytes=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 -r stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}')
whl_bytes=$(du -sb "$dest" | cut -f1)
total=$((tree_bytes + whl_bytes))
awk -v t="$tree_bytes" -v w="$whl_bytes" -v d="$dest" \
  'BEGIN {printf "source tree %.1f MiB + %s %.1f MiB = %.1f MiB (limit 64 MiB)\n", t/1048576, d, w/1048576, (t+w)/1048576}'
[ "$total" -le $((64 * 1048576)) ] || { echo "gpu_wheels.sh: over 64 MiB" >&2; exit 1; }
ls "$dest"
