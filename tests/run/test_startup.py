"""Start-up costs that must stay cut: resolving a gymnax env does not import gymnax's plotting
modules (seaborn pulls in scipy.stats: about 2 s of every run), yet gymnax's rendering and a later
``import seaborn`` still get the real modules; async runs build their states with one compiled
program each (not op by op). Each check runs in a fresh child process."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = r"""
import json, sys
import tianji_jax as tj
tj.PPOConfig(env="gymnax:CartPole-v1")
out = {"loaded_early": [m for m in ("seaborn", "scipy.stats", "matplotlib.pyplot") if m in sys.modules]}
from gymnax.environments.misc import pong
out["palette"] = len(pong.sns.color_palette("cubehelix", 3))  # gymnax's render helper still works
import seaborn
out["real_seaborn"] = type(seaborn).__name__ == "module" and hasattr(seaborn, "color_palette")
print("OUT" + json.dumps(out))
"""


def test_gymnax_plotting_modules_are_deferred_and_still_work():
    """Budget ~15 s (one child process)."""
    run = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads([line for line in run.stdout.splitlines() if line.startswith("OUT")][-1][3:])
    assert out == {"loaded_early": [], "palette": 3, "real_seaborn": True}


THREADS_CHILD = r"""
import json, sys, threading
from tianji_jax.envs import spaces
# A stand-in found in sys.modules by another thread while gymnax is being imported: touching it
# imports the real module (it used to find itself again and recurse without end).
stand_in = spaces._Deferred("seaborn")
sys.modules["seaborn"] = stand_in
out = {"stand_in_forwards": len(stand_in.color_palette("cubehelix", 2)) == 2,
       "real_after": sys.modules["seaborn"] is not stand_in}
assert "gymnax" not in sys.modules
barrier, got = threading.Barrier(4), []
def resolve():
    barrier.wait()
    got.append(hasattr(spaces.import_gymnax(), "make"))  # never a half-imported gymnax
threads = [threading.Thread(target=resolve) for _ in range(4)]
[t.start() for t in threads]
[t.join(120) for t in threads]
out["all_whole"] = got == [True] * 4
print("OUT" + json.dumps(out))
"""


def test_gymnax_import_is_thread_safe():
    """Budget ~15 s (one child process): four threads resolving gymnax at once each get the whole
    module, and a plotting stand-in touched from another thread imports the real module."""
    run = subprocess.run([sys.executable, "-c", THREADS_CHILD], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads([line for line in run.stdout.splitlines() if line.startswith("OUT")][-1][3:])
    assert out == {"stand_in_forwards": True, "real_after": True, "all_whole": True}


def test_async_inits_are_one_program_each(compile_counter):
    """An async DQN run's start-up, minus its rollout/insert/learn/evaluate programs, compiles a
    handful of programs, not the ~50 single ops of eager flax inits."""
    import tianji_jax as tj

    tj.clear_caches()
    compile_counter.reset()
    tj.train(tj.DQNConfig(runtime="async", num_envs=4, num_steps=5, learning_starts=64, buffer_capacity=256,
                          batch_size=16, total_env_steps=128, eval_episodes=0, seed=5), progress=False)
    assert compile_counter.count <= 30, compile_counter.count
