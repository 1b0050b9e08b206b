#!/usr/bin/env bash
# GPU check of the training launch (issue 6) and its telemetry (issue 15): the same launch as the
# CPU tests, with NCCL; then NVML energy, CUDA memory stats, fp16 overflow counting, NCCL init.
#
#   bash bench/gpu_check.sh            # results under $OUT (default bench/_work/gpu_check)
#
# On a machine with NVIDIA GPUs and a Python that has torch with CUDA (nothing is installed;
# the machine may have no network): topology -> plan -> 2-rank NCCL launch with checkpoints ->
# the same launch with a worker SIGKILLed and restarted (its losses must equal the first run's)
# -> health report of the NCCL_DEBUG=INFO log -> nccl-tests all_reduce_perf if it is installed.
# Every step writes its JSON under $OUT; the last line says PASS or FAIL. Nothing depends on it.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-bench/_work/gpu_check}"
mkdir -p "$OUT"
PY="${PYTHON:-}"
for candidate in "$PY" .venv/bin/python python3 python; do
  if [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1 \
     && "$candidate" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    PY="$candidate"; break
  fi
  PY=""
done
if [ -z "$PY" ]; then
  echo "FAIL: no Python with torch + CUDA found (set PYTHON=...)"; exit 1
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
SEEDANCE=("$PY" -m seedance_tasks.cli)
status=0
step() { echo "==> $*"; }

step "environment"
nvidia-smi -L | tee "$OUT/gpus.txt"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())" \
  | tee "$OUT/versions.txt"
NGPU=$("$PY" -c "import torch; print(torch.cuda.device_count())")
NPROC=$(( NGPU >= 2 ? 2 : 1 ))

step "topology + plan"
nvidia-smi topo -m | tee "$OUT/topo.txt"
"${SEEDANCE[@]}" train plan --topology "$OUT/topo.txt" --nproc-per-node "$NPROC" --json > "$OUT/plan.json" \
  || { echo "plan failed"; status=1; }
"$PY" - "$OUT/plan.json" <<'EOF' || status=1
import json, sys
plan = json.load(open(sys.argv[1]))
print("profile", plan["profile"]["name"], "env", plan["env"])
assert plan["gpus"], "no GPUs parsed from nvidia-smi topo -m"
EOF

STORE="$OUT/store"
rm -rf "$STORE" "$OUT/run-a" "$OUT/run-b"
COMMON=(train launch --topology "$OUT/topo.txt" --backend nccl --nproc-per-node "$NPROC" --steps 12
        --checkpoint-store "$STORE" --checkpoint-every 4 --json)

step "launch with NCCL ($NPROC ranks)"
"${SEEDANCE[@]}" "${COMMON[@]}" --run a --log-dir "$OUT/run-a" > "$OUT/launch-a.json" || status=1

if [ "$NPROC" -ge 2 ]; then
  step "launch, SIGKILL rank 1 after step 6, restart, resume from step 4"
  SEEDANCE_TRAIN_FAIL_AT_STEP=6 "${SEEDANCE[@]}" "${COMMON[@]}" --run b --max-restarts 1 \
    --log-dir "$OUT/run-b" > "$OUT/launch-b.json" || status=1
  "$PY" - "$OUT/launch-a.json" "$OUT/launch-b.json" <<'EOF' || status=1
import json, sys
a, b = (json.load(open(path)) for path in sys.argv[1:3])
print("a:", a["ok"], a["losses"])
print("b:", b["ok"], b["losses"], "starts", b["starts"])
assert a["ok"] and b["ok"], (a["error"], b["error"])
assert [s["resumed_from"] for s in b["starts"]] == [0, 4], b["starts"]
same = a["losses"] == b["losses"]
close = max(abs(x - y) for x, y in zip(a["losses"], b["losses"])) if len(a["losses"]) == len(b["losses"]) else None
print("identical trajectory:", same, "max |diff|:", close)
assert close is not None and close < 1e-4, "resumed trajectory differs"
EOF
fi

step "health of the NCCL log"
"${SEEDANCE[@]}" train health "$OUT/run-a/launch.log" --json > "$OUT/health-a.json" || status=1
"$PY" -c "import json,sys; r=json.load(open(sys.argv[1])); print(r['verdict']['status'], r['channels'], r['transports'])" \
  "$OUT/health-a.json" || status=1

if command -v all_reduce_perf >/dev/null 2>&1; then
  step "nccl-tests all_reduce_perf"
  PROFILE=$("$PY" -c "import json; print(json.load(open('$OUT/plan.json'))['profile']['name'])")
  all_reduce_perf -g "$NGPU" -b 8 -e 4G -f 2 | tee "$OUT/all_reduce_perf.txt"
  "${SEEDANCE[@]}" train health "$OUT/all_reduce_perf.txt" --profile "$PROFILE" --json > "$OUT/health-perf.json"
else
  echo "(nccl-tests all_reduce_perf not installed: bandwidth check skipped)"
fi

step "telemetry on the GPU: NVML energy, CUDA memory stats, fp16 overflow counting, NCCL init (issue 15)"
"$PY" - "$OUT" <<'EOF' > "$OUT/telemetry.txt" 2>&1 || status=1
import json, os, sys
import torch, torch.distributed as dist
from torch import nn
from seedance_tasks.config import load_settings
from seedance_tasks.telemetry.recorder import StepRecorder
from seedance_tasks.training.trainer import Precision, TinyGPT, synthetic_tokens, train_step
out = sys.argv[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29577")
torch.cuda.set_device(0)
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))  # NCCL initialises
x = torch.ones(4, device="cuda"); dist.all_reduce(x); torch.cuda.synchronize()
print("nccl all_reduce ok", x.tolist(), "nccl", torch.cuda.nccl.version())
settings = load_settings().telemetry
settings.port = None
recorder = StepRecorder(settings, folder=os.path.join(out, "telemetry"), run="gpu-check", device="cuda:0")
print("energy source", recorder.meter.source, "price", recorder.price.describe())
assert recorder.meter.source == "nvml", "no NVML energy counter"
model = TinyGPT(vocab_size=256, seq_len=128, d_model=512, n_layers=4, n_heads=8).cuda()
ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
precision = Precision("fp16", torch.device("cuda", 0), init_scale=2.0**40)  # the first steps overflow
batch = lambda micro: synthetic_tokens(1, 0, micro, 16, 128, 256).cuda()
skipped = 0
for step in range(1, 61):
    with recorder.step(step):
        _loss, was_skipped = train_step(ddp, opt, precision, batch, 2, nn.CrossEntropyLoss(), recorder)
    skipped += was_skipped
snap = recorder.close()
totals, last = snap["totals"], snap["last"]
print(json.dumps({"totals": totals, "last": last, "energy": snap["energy"]}, indent=1, default=str))
assert totals["skipped_steps"] == skipped and skipped >= 1, "fp16 overflow not counted"
assert last["loss_scale"] < 2.0**40
assert totals["energy_joules"] > 0, "NVML energy counter did not move"
assert last["memory_allocated_bytes"] > 0 and last["memory_reserved_bytes"] >= last["memory_allocated_bytes"]
with torch.autocast("cuda", dtype=torch.bfloat16):
    assert model(batch(0)[:, :-1]).dtype == torch.bfloat16
dist.destroy_process_group()
print("telemetry check ok: energy %.1f J over %.2f s, %d skipped steps, alloc retries %d" % (
    totals["energy_joules"], totals["step_seconds"], skipped, totals["alloc_retries"]))
EOF
tail -3 "$OUT/telemetry.txt"

if [ "$status" -eq 0 ]; then echo "PASS: results in $OUT"; else echo "FAIL: see $OUT"; fi
exit "$status"
