#!/bin/bash
# Run HERE (not on the device), from the repo root: the wheels the H200 image lacks for --executor ray, for its
# Python 3.12, split over two carry folders (the ray wheel alone is ~80 MB, over one call's 64 MiB carry limit):
#   .device/ray1: the first 45 MB of the ray wheel + jsonschema & co. + ksearch's own missing wheels
#   .device/ray2: the rest of the ray wheel, and its sha256
# Then on the device: bash bench/gpu/throughput_h200.sh 1 (carry .device/ray1), at once
# bash bench/gpu/throughput_h200.sh 2 (carry .device/ray2): the machine must stay warm between the two.
set -eu
RAY=${RAY:-2.60.0}
P="--only-binary=:all: --no-deps --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
rm -rf .device/ray1 .device/ray2 /tmp/ksearch-raywhl && mkdir -p .device/ray1 .device/ray2 /tmp/ksearch-raywhl
python3 -m pip download -q $P -d /tmp/ksearch-raywhl "ray==$RAY"
for w in jsonschema jsonschema-specifications referencing rpds-py pydantic==2.14.4 pydantic-core==2.50.5 \
         annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0 pyelftools==0.33; do
  python3 -m pip download -q $P -d .device/ray1 "$w"
done
whl=$(ls /tmp/ksearch-raywhl/ray-*.whl)
sha256sum "$whl" | awk '{print $1}' > .device/ray2/ray.sha256
basename "$whl" > .device/ray2/ray.name
split -b 45m "$whl" /tmp/ksearch-raywhl/part.
mv /tmp/ksearch-raywhl/part.aa .device/ray1/ray.part.aa
mv /tmp/ksearch-raywhl/part.ab .device/ray2/ray.part.ab
du -sh .device/ray1 .device/ray2
