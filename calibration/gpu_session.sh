#!/usr/bin/env bash
# One call on a GPU machine that has nothing but torch: measure the GPU for one model's shapes, then run
# the reference loop on CUDA with recompute none, selective and full, every record under OUTDIR.
#
#   calibration/gpu_session.sh OUTDIR [--model NAME|FILE] [--quick] [--dry-run]
#
# --model     a preset (default gpt3-1.3b) or a YAML/JSON model file; its layer sets the GEMM,
#             attention and memory-bound shapes measured and is what the reference loop trains
# --quick     fewer sizes and repetitions
# --dry-run   the same steps on this machine's CPU with a tiny model, in about a minute (CI runs it)
#
# Writes OUTDIR/session.log, OUTDIR/raw.json (the measured points), OUTDIR/run-{none,selective,full}.json
# (the reference runs) and, where numpy and scipy are importable, OUTDIR/profile.json. pydantic and
# PyYAML (for the model, the plan and the records) come from the wheels in $WHEELS_DIR (default .whl/,
# made by calibration/fetch_wheels.sh and carried to the machine) when the machine lacks them; numpy
# is not needed. Fit and validate at home:
#   simulator calibrate --raw OUTDIR/raw.json --out PROFILE.json
#   simulator validate OUTDIR/run-selective.json --profile PROFILE.json
# The whole script stays inside $SESSION_TOTAL_S (default 540 s, 150 s for a dry run); each step gets
# what is left, and the reference runs keep $REFERENCE_S (default 200 s, 60 s dry) of it. The runs
# use $REFERENCE_TP GPUs (default 1), micro-batch $REFERENCE_MBS (2), global batch $REFERENCE_GBS (8)
# and $REFERENCE_ITERATIONS (6, the first a warm-up); the measured shapes are the same layer's.
set -euo pipefail

usage() { echo "usage: calibration/gpu_session.sh OUTDIR [--model NAME|FILE] [--quick] [--dry-run]" >&2; exit 2; }
[[ $# -ge 1 && "$1" != -* ]] || usage
OUTDIR=$1; shift
MODEL=gpt3-1.3b; QUICK=""; DRY=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --model) [[ $# -ge 2 ]] || usage; MODEL=$2; shift 2 ;;
        --quick) QUICK=--quick; shift ;;
        --dry-run) DRY=1; shift ;;
        *) echo "unknown argument '$1'" >&2; usage ;;
    esac
done
PY=${PYTHON:-python3}
WHEELS_DIR=${WHEELS_DIR:-.whl}
if (( DRY )); then
    DEVICE=cpu; TOTAL_S=${SESSION_TOTAL_S:-150}; REFERENCE_S=${REFERENCE_S:-60}; ITERATIONS=2; MBS=1; GBS=2; TP=1
    [[ "$MODEL" == gpt3-1.3b ]] && MODEL=calibration/reference/gpt-tiny.yaml
else
    DEVICE=cuda; TOTAL_S=${SESSION_TOTAL_S:-540}; REFERENCE_S=${REFERENCE_S:-200}
    ITERATIONS=${REFERENCE_ITERATIONS:-6}; MBS=${REFERENCE_MBS:-2}; GBS=${REFERENCE_GBS:-8}
    TP=${REFERENCE_TP:-1}  # one process per GPU; a one-GPU machine trains without tensor parallelism
fi
[[ "$MODEL" = /* || ! -e "$MODEL" ]] || MODEL=$(cd "$(dirname "$MODEL")" && pwd)/$(basename "$MODEL")
WHEELS_DIR=$(cd "$(dirname "$WHEELS_DIR")" 2>/dev/null && pwd)/$(basename "$WHEELS_DIR")

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
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
STATUS=0

section "environment"
date -u
hostname || true
echo "model $MODEL, device $DEVICE, $( (( DRY )) && echo 'dry run' || echo 'session'), limit ${TOTAL_S} s"
if command -v nvidia-smi >/dev/null 2>&1; then
    timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv || true
else
    echo "nvidia-smi: not found"
fi
"$PY" - <<'PYEOF'
import os, platform, torch
print("python", platform.python_version(), "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "| cores", os.cpu_count(), "| load average", " ".join(f"{x:.2f}" for x in os.getloadavg()))
print("cuda available:", torch.cuda.is_available(), "| devices:", torch.cuda.device_count())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device 0:", p.name, "| SMs", p.multi_processor_count, "| memory GiB", round(p.total_memory / 2**30, 1),
          "| nccl", torch.cuda.nccl.version())
PYEOF

section "python packages"
if ! "$PY" -c "import pydantic, yaml" 2>/dev/null; then
    SITE="${TMPDIR:-/tmp}/gpu-session-site"
    if compgen -G "$WHEELS_DIR/*.whl" >/dev/null; then
        echo "installing pydantic and PyYAML from $WHEELS_DIR into $SITE"
        "$PY" -m pip install -q --no-index --find-links "$WHEELS_DIR" --target "$SITE" --no-compile \
            --disable-pip-version-check pydantic pyyaml && export PYTHONPATH="$SITE:$PYTHONPATH" \
            || echo "installing the carried wheels failed"
    else
        echo "pydantic or PyYAML missing and no wheels in $WHEELS_DIR (make them with calibration/fetch_wheels.sh)"
    fi
fi
HAVE_SIM=0
"$PY" -c "import pydantic, yaml" 2>/dev/null && HAVE_SIM=1
if (( HAVE_SIM )); then echo "pydantic and PyYAML: yes"
else echo "pydantic and PyYAML: no (the model must be the default, and no reference runs)"; fi
"$PY" -c "import numpy" 2>/dev/null && echo "numpy: yes" || echo "numpy: no (not needed)"

section "model shapes"
if (( HAVE_SIM )); then
    SHAPES=$("$PY" - "$MODEL" <<'PYEOF'
import sys
from simulator.measure.calibrate import layer_arguments
from simulator.spec.catalog import load_model
print(" ".join(layer_arguments(load_model(sys.argv[1]))))
PYEOF
) || { echo "cannot read model $MODEL"; exit 2; }
elif [[ "$MODEL" == gpt3-1.3b ]]; then
    SHAPES="--hidden 2048 --heads 16 --ffn 8192 --seq 2048 --vocab 51200"  # simulator/spec/model.py's gpt3-1.3b
else
    echo "reading model $MODEL needs pydantic and PyYAML; carry the wheels or use the default model"; exit 2
fi
echo "layer shapes: $SHAPES --micro-batch $MBS --tp $TP"

section "measure"
BUDGET=$(( $(left) - REFERENCE_S - 30 ))
MEASURE_RC=0
if (( DRY )); then BUDGET=$(( BUDGET < 35 ? BUDGET : 35 )); fi
if (( BUDGET < 20 )); then
    echo "skipping measurement: only ${BUDGET} s would be left for it"
    MEASURE_RC=3
else
    # the driver keeps its own per-section budgets; timeout is the backstop for a hang
    # shellcheck disable=SC2086
    timeout --kill-after=10 $(( BUDGET + 20 )) \
        "$PY" -m calibration.measure --device "$DEVICE" $QUICK --budget-s "$BUDGET" --out "$OUTDIR/raw.json" \
        $SHAPES --micro-batch "$MBS" --tp "$TP" || MEASURE_RC=$?
    echo "measure exit code: $MEASURE_RC"
fi
(( MEASURE_RC == 0 )) || STATUS=1

section "summary of raw points"
if [[ -f "$OUTDIR/raw.json" ]]; then
    "$PY" - "$OUTDIR/raw.json" <<'PYEOF'
import json, sys
raw = json.load(open(sys.argv[1]))
d = raw["device"]
print(f"{d.get('name')} | driver {d.get('driver')} | torch {d.get('torch_version')} | cuda {d.get('cuda_version')} "
      f"| load {d.get('load_average')}")
for name, info in raw["sections"].items():
    print(f"  {name:12s} {info['status']:8s} {len(raw.get(name, [])):4d} points  {info.get('elapsed_s', 0):6.1f} s"
          + (f"  skipped {len(info['skipped'])}" if info.get("skipped") else "")
          + (f"  {info['error']}" if info.get("error") else ""))
if raw["gemm"]:
    best = max(raw["gemm"], key=lambda p: p["tflops"])
    print(f"  best GEMM {best['m']}x{best['n']}x{best['k']}x{best['batch']}: {best['tflops']:.1f} TFLOP/s")
for p in raw["attention"]:
    if p["seq"] == raw["settings"]["layer"]["seq_length"]:
        print(f"  attention {p['impl']:7s} {p['pass']:8s} s={p['seq']}: {p['tflops']:.1f} TFLOP/s")
copies = [p for p in raw["elementwise"] if p["kernel"] == "copy"]
if copies:
    print(f"  largest copy: {max(copies, key=lambda p: p['numel'])['gbps']:.0f} GB/s")
for p in raw.get("sustained", []):
    late = sorted(p["window_s"][len(p["window_s"]) // 2:])
    print(f"  sustained {p['m']}^3 GEMM: burst {p['flops'] / p['burst_s'] / 1e12:.1f} TFLOP/s, later windows "
          f"{p['flops'] / late[len(late) // 2] / 1e12:.1f} TFLOP/s over {p['seconds']:.0f} s"
          f" on {len(p.get('device_window_s', [1]))} device(s) at once")
for h in raw.get("host", []):
    print(f"  host {h['what']:26s} sync={h['synchronize']!s:5s} {h['time_s'] * 1e6:8.1f} us")
PYEOF
else
    echo "no raw points were written"
fi

section "reference runs (recompute none, selective, full)"
if (( ! HAVE_SIM )); then
    echo "skipped: pydantic and PyYAML are not importable here"
    STATUS=1
else
    RUN_BUDGET=$(( $(left) - 15 ))
    if (( RUN_BUDGET < 30 )); then
        echo "skipped: only ${RUN_BUDGET} s left"
        STATUS=1
    else
        timeout --kill-after=10 $(( RUN_BUDGET + 5 )) "$PY" -m calibration.gpu_runs --model "$MODEL" \
            --device "$DEVICE" --out "$OUTDIR" --tp "$TP" --mbs "$MBS" --gbs "$GBS" --iterations "$ITERATIONS" \
            --budget-s "$RUN_BUDGET" || { echo "reference runs exit code: $?"; STATUS=1; }
    fi
fi

section "fit"
if [[ ! -f "$OUTDIR/raw.json" ]]; then
    echo "nothing to fit"
elif ! "$PY" -c "import pydantic, yaml, click, numpy, scipy, networkx, simpy" 2>/dev/null; then
    echo "the fit needs numpy, scipy, networkx, simpy and click, which are not all here: fit at home with"
    echo "  simulator calibrate --raw $OUTDIR/raw.json --out PROFILE.json"
elif (( $(left) < 10 )); then
    echo "skipping the fit: $(left) s left; fit at home with: simulator calibrate --raw raw.json --out PROFILE.json"
else
    timeout $(( $(left) - 3 )) "$PY" -m simulator calibrate --raw "$OUTDIR/raw.json" --out "$OUTDIR/profile.json" \
        || echo "fit refused or failed (exit $?); see the line above, or fit at home"
fi

section "done"
ls -l "$OUTDIR"
echo "session exit code: $STATUS (0: measured and every reference run has its record)"
exit "$STATUS"
