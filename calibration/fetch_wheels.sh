#!/usr/bin/env bash
# The wheels a GPU session needs beyond torch (pydantic and PyYAML, for the model, the plan and the
# run records), at the versions installed here, for the CPython versions a GPU machine may run; carry
# the folder to the machine beside the checkout (calibration/gpu_session.sh installs from it).
#
#   calibration/fetch_wheels.sh [DIR]      (default .whl, which git ignores)
set -euo pipefail
DIR=${1:-.whl}
PY=${PYTHON:-python3}
PKGS=$("$PY" - <<'PYEOF'
from importlib.metadata import version
names = ("pydantic", "pydantic-core", "annotated-types", "typing-extensions", "typing-inspection", "pyyaml")
print(" ".join(f"{n}=={version(n)}" for n in names))
PYEOF
)
mkdir -p "$DIR"
for v in ${PYTHON_VERSIONS:-3.10 3.11 3.12 3.13}; do
    # shellcheck disable=SC2086
    "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: --dest "$DIR" \
        --python-version "$v" --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux_2_28_x86_64 $PKGS
done
echo "$(ls "$DIR"/*.whl | wc -l) wheels in $DIR ($(du -sh "$DIR" | cut -f1)): $PKGS"
