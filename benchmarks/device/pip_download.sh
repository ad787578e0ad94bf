# Sourced by wheels.sh and unsloth_wheels.sh: get DIR SPEC... downloads the wheels of SPEC for
# the GPU machine (CPython 3.12, x86-64 manylinux, no dependencies: each script names them) into
# DIR; a failed download stops the script with pip's output, pip's location notes dropped.
get() {
  local log; log=$(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_28_x86_64 --platform any -d "$@" 2>&1) \
    || { echo "$log"; exit 1; }
  echo "$log" | grep -v "^WARNING: Location" || true
}
