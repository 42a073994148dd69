#!/usr/bin/env bash
# The whole GPU calibration in one call, under 8 minutes on a one-GPU machine, no network:
#
#   calibration/gpu_session.sh OUTDIR [--quick]
#
# Writes OUTDIR/session.log, OUTDIR/raw.json (the measured points) and, where pydantic is importable
# (or wheels for it sit in $WHEELS_DIR, default .whl/), OUTDIR/profile.json. Otherwise fit at home:
#   simulator calibrate --raw OUTDIR/raw.json --out PROFILE.json
# The same Python entry points run on the CPU (CALIBRATION_DEVICE=cpu), which the tests exercise.
set -euo pipefail

OUTDIR=${1:?usage: calibration/gpu_session.sh OUTDIR [--quick]}
QUICK=${2:-}
DEVICE=${CALIBRATION_DEVICE:-cuda}
TOTAL_S=${CALIBRATION_TOTAL_S:-450}   # the whole script; the 8-minute limit is 480 s
FIT_RESERVE_S=${CALIBRATION_FIT_RESERVE_S:-40}
PY=${PYTHON:-python3}
WHEELS_DIR=${WHEELS_DIR:-.whl}
if [[ -n "$QUICK" && "$QUICK" != "--quick" ]]; then
    echo "second argument must be --quick or nothing, got '$QUICK'" >&2
    exit 2
fi

cd "$(dirname "$0")/.."
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
LOG="$OUTDIR/session.log"
exec > >(tee -a "$LOG") 2>&1
START=$(date +%s)
elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( TOTAL_S - $(elapsed) )); }
section() { echo; echo "== $1 (t=$(elapsed) s, $(left) s left)"; }
export PYTHONUNBUFFERED=1

section "environment"
date -u
hostname || true
uname -a || true
if command -v nvidia-smi >/dev/null 2>&1; then
    timeout 30 nvidia-smi || echo "nvidia-smi failed (exit $?)"
    timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv || true
else
    echo "nvidia-smi: not found"
fi
"$PY" - <<'PYEOF'
import platform, torch, numpy
print("python", platform.python_version(), "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "| numpy", numpy.__version__)
print("cuda available:", torch.cuda.is_available(), "| devices:", torch.cuda.device_count())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device 0:", p.name, "| SMs", p.multi_processor_count, "| memory GiB", round(p.total_memory / 2**30, 1),
          "| nccl", torch.cuda.nccl.version())
PYEOF

section "measure"
BUDGET=$(( $(left) - FIT_RESERVE_S - 20 ))
MEASURE_RC=0
if (( BUDGET < 30 )); then
    echo "skipping measurement: only ${BUDGET} s would be left for it"
    MEASURE_RC=3
else
    # the driver keeps its own per-section budgets; timeout is the backstop for a hang
    timeout --kill-after=10 $(( BUDGET + 15 )) \
        "$PY" -m calibration.measure --device "$DEVICE" $QUICK --budget-s "$BUDGET" --out "$OUTDIR/raw.json" \
        || MEASURE_RC=$?
    echo "measure exit code: $MEASURE_RC"
fi

section "summary of raw points"
if [[ -f "$OUTDIR/raw.json" ]]; then
    "$PY" - "$OUTDIR/raw.json" <<'PYEOF'
import json, sys
raw = json.load(open(sys.argv[1]))
d = raw["device"]
print(f"{d.get('name')} | driver {d.get('driver')} | torch {d.get('torch_version')} | cuda {d.get('cuda_version')}")
for name, info in raw["sections"].items():
    print(f"  {name:12s} {info['status']:8s} {len(raw.get(name, [])):4d} points  {info.get('elapsed_s', 0):6.1f} s"
          + (f"  skipped {len(info['skipped'])}" if info.get("skipped") else "") + (f"  {info['error']}" if info.get("error") else ""))
if raw["gemm"]:
    best = max(raw["gemm"], key=lambda p: p["tflops"])
    print(f"  best GEMM {best['m']}x{best['n']}x{best['k']}x{best['batch']}: {best['tflops']:.1f} TFLOP/s")
for p in raw["attention"]:
    if p["seq"] == raw["settings"]["layer"]["seq_length"]:
        print(f"  attention {p['impl']:7s} {p['pass']:8s} s={p['seq']}: {p['tflops']:.1f} TFLOP/s")
copies = [p for p in raw["elementwise"] if p["kernel"] == "copy"]
if copies:
    print(f"  largest copy: {max(copies, key=lambda p: p['numel'])['gbps']:.0f} GB/s")
PYEOF
else
    echo "no raw points were written"
fi

section "fit"
if [[ ! -f "$OUTDIR/raw.json" ]]; then
    echo "nothing to fit"
elif (( $(left) < 15 )); then
    echo "skipping the fit: $(left) s left; fit at home with: simulator calibrate --raw raw.json --out PROFILE.json"
else
    if ! "$PY" -c "import pydantic" 2>/dev/null && compgen -G "$WHEELS_DIR/*.whl" >/dev/null; then
        echo "installing carried wheels from $WHEELS_DIR into /tmp/calibration-site"
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/calibration-site "$WHEELS_DIR"/*.whl && export PYTHONPATH=/tmp/calibration-site${PYTHONPATH:+:$PYTHONPATH} \
            || echo "wheel install failed; fit at home instead"
    fi
    if "$PY" -c "import pydantic, yaml, scipy" 2>/dev/null; then
        timeout $(( $(left) > 20 ? $(left) - 5 : 15 )) \
            "$PY" -m simulator calibrate --raw "$OUTDIR/raw.json" --out "$OUTDIR/profile.json" \
            || echo "fit failed (exit $?); fit at home with: simulator calibrate --raw raw.json --out PROFILE.json"
    else
        echo "pydantic is not installed here: fit at home with"
        echo "  simulator calibrate --raw $OUTDIR/raw.json --out PROFILE.json"
    fi
fi

section "done"
ls -l "$OUTDIR"
exit "$MEASURE_RC"
