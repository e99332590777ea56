#!/usr/bin/env bash
# One call on a lent accelerator machine (see experiments/accelerator.py): installs the wheels
# carried in .whl/ (the machine has no package index; its own jax, CUDA plugin and numpy are used),
# then, side by side, experiments/accelerator.py on the accelerator (cores 0-7 feed it) and on the
# CPU backend (cores 8-15), then a few test files on the accelerator. Everything goes to $OUT
# (at most 8 files come back): accelerator_{cuda,cpu}.csv, machine_{cuda,cpu}.json, gpu.log,
# cpu.log, tests.log, nvidia-smi.txt. Budget: ~520 s.
set -u
OUT=${OUT:-/tmp/accelerator_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed" > "$OUT/gpu.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
python3 -c "import jax, flax, optax, gymnax, tianji_jax; print('jax', jax.__version__, jax.devices(), 'flax', flax.__version__)" \
    >> "$OUT/nvidia-smi.txt" 2>&1
TIANJI_COMPILATION_CACHE_DIR=/tmp/xla_cpu taskset -c 8-15 timeout 400 python3 experiments/accelerator.py \
    --platform cpu --envs-list 64,1024,8192 --cap-s 130 --out "$OUT" > "$OUT/cpu.log" 2>&1 &
CPU_PID=$!
TIANJI_COMPILATION_CACHE_DIR=/tmp/xla_gpu taskset -c 0-7 timeout 400 python3 experiments/accelerator.py \
    --cap-s 130 --out "$OUT" > "$OUT/gpu.log" 2>&1
echo "accelerator run exit $?" >> "$OUT/gpu.log"
wait $CPU_PID
echo "cpu run exit $?" >> "$OUT/cpu.log"
# The numerics guarantees on the accelerator: sweep members equal single runs and repeat
# bit for bit, Anakin resume is exact, async `sync` equals Anakin.
timeout 100 python3 -m pytest -q -n 4 --dist loadfile -p no:cacheprovider --timeout 90 -rfE \
    tests/run/test_sweep.py tests/runtime/test_anakin.py tests/runtime/test_dqn_anakin.py tests/runtime/test_async_runtime.py \
    > "$OUT/tests.log" 2>&1
echo "tests exit $?" >> "$OUT/tests.log"
tail -n 40 "$OUT"/accelerator_*.csv
