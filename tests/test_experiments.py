"""experiments/ scripts in --quick mode: files written, columns present, values sane."""

import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_anakin_seeds_quick(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "anakin_seeds.py"), "--quick", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("results.csv", "summary.md", "curves.png", "machine.json"):
        assert (tmp_path / name).stat().st_size > 0, name
    df = pd.read_csv(tmp_path / "results.csv")
    assert list(df["seed"]) == [0, 1]
    assert {"train_steps_to_threshold", "eval_steps_to_threshold", "final_train_return",
            "final_eval_return"} <= set(df.columns)
    # CartPole returns lie in [0, 500]; steps to threshold are NaN or within the budget
    assert df["final_eval_return"].between(0, 500).all() and df["final_train_return"].between(0, 500).all()
    assert all(math.isnan(v) or 0 < v <= 50_000 for v in df["eval_steps_to_threshold"])
    summary = (tmp_path / "summary.md").read_text()
    assert "--quick" in summary and "vmap speed-up" in summary
