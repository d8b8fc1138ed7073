#!/bin/bash
# Run HERE (not on the device), from the repo root, in README's venv (torch installed): the git-ignored carry folders
# the device scripts name, for the device image's Python 3.12 (it has torch, triton, cupy, numpy; not the rest):
#   .device/wheels: ksearch's pure-Python dependencies the image lacks (pydantic & co., PyYAML, Jinja2, typer, rich,
#                   pyelftools), ~6 MB
#   .device/mamba:  the mamba-ssm 2.3.2.post1 sdist (~0.2 MB; the bench builds its CUDA extension with torch's JIT
#                   loader, ../shared/reference/device-recipes.md)
# Usage: bash bench/gpu/device_carry.sh [wheels] [mamba]   (both when none named)
set -eu
what=${*:-wheels mamba}
P="--only-binary=:all: --no-deps --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
for w in $what; do
  case $w in
    wheels)
      rm -rf .device/wheels && mkdir -p .device/wheels
      # with their dependencies, resolved for the image's platform (pydantic and pydantic-core must match)
      python3 -m pip download -q ${P/--no-deps/} -d .device/wheels pydantic pyyaml jinja2 typer rich pyelftools ;;
    mamba)
      rm -rf .device/mamba && mkdir -p .device/mamba
      MAMBA_SKIP_CUDA_BUILD=TRUE python3 -m pip download -q --no-deps --no-binary :all: --no-build-isolation \
        -d .device/mamba mamba-ssm==2.3.2.post1 ;;
    *) echo "unknown carry '$w' (wheels, mamba)" >&2; exit 2 ;;
  esac
done
du -sh .device/* 2>/dev/null
