"""`layup memory`, `bench` and `study` take the model flags of `layup train` (--layers, --heads,
--dim, --context), so the model a user will train can be planned and measured first."""
import json

from oracle_util import binary, run

EXPLICIT_MODEL = ["--layers", "2", "--heads", "2", "--dim", "64", "--context", "64"]
SIZES = "2 layers, 2 heads, width 64"


def test_memory_plans_an_explicit_model():
    result = run([binary("layup"), "memory", "--device", "cpu", *EXPLICIT_MODEL, "--batch", "2",
                  "--seq-len", "64", "--mode", "layup"])
    assert f"custom ({SIZES}; 3.3M parameters), B=2 x T=64" in result.stdout, result.stdout
    assert "memory plan for custom in layup mode" in result.stdout, result.stdout


def test_bench_runs_an_explicit_model(tmp_path):
    result = run([binary("layup"), "bench", "--device", "cpu", *EXPLICIT_MODEL, "--batch", "2",
                  "--seq-len", "64", "--warmup", "1", "--steps", "2", "--json",
                  tmp_path / "bench.json"])
    assert f"custom ({SIZES})" in result.stdout, result.stdout
    measured = json.loads((tmp_path / "bench.json").read_text())
    assert [measured[key] for key in ("model", "n_layer", "n_head", "n_embd", "n_positions")] == \
        ["custom", 2, 2, 64, 64]
    assert measured["timed_steps"] == 2


def test_study_runs_an_explicit_model(tmp_path):
    run([binary("layup"), "study", "--device", "cpu", *EXPLICIT_MODEL, "--batch", "2",
         "--seq-len", "32", "--warmup", "1", "--steps", "1", "--no-energy", "--out",
         tmp_path / "study"])
    assert "layup study: custom, B=2, T=32" in (tmp_path / "study" / "study.md").read_text()
