"""PyTorch Lightning resumes a loaderlib loader exactly (NOTE [ Lightning and the loader state ]).

The real framework on CPU: ``Trainer(accelerator="cpu", devices=2, strategy="ddp")`` (gloo),
each run a new process running ``lightning_run.py``. Run A trains 12 steps straight; run B
trains 6 steps with a ``ModelCheckpoint`` every 2 steps; new processes resume from B's
checkpoints with ``fit(ckpt_path=...)``: from step 6 (mid-epoch: 4 batches per epoch per rank)
to step 12, from step 4 (an epoch boundary) to step 8, and from step 6 on one device (another
world size). Each rank's batches must equal run A's from the same step, and run A itself must
follow the documented order (a plain-Python model: each epoch's global order, rank ``r``
taking slots ``r, r + 2, ...``, padded by wrapping around). Lightning saves rank 0's loader
state only and loads it on every rank: this is what NOTE [ One state for every rank ] is for.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

import loaderlib as ll

pytestmark = pytest.mark.frameworks

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "lightning_run.py")
N, BATCH, ORDER_SEED = 30, 4, 3   # as in lightning_run.py


def _require_lightning() -> str:
    try:
        import lightning
    except ImportError as e:   # a test dependency: fail saying why, never skip
        pytest.fail(f"PyTorch Lightning does not import ({e}); it is a test dependency: `make test-long` installs "
                    "requirements-frameworks.txt over the local CPU torch")
    return lightning.__version__


def _run(out, *args: str) -> dict[int, list[list[int]]]:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    p = subprocess.run([sys.executable, SCRIPT, str(out), *args], capture_output=True, text=True, timeout=600,
                       env=env, cwd=HERE)
    assert p.returncode == 0, f"lightning_run.py {' '.join(args)} failed:\n{(p.stdout + p.stderr)[-4000:]}"
    ranks = {}
    for name in sorted(os.listdir(out)):
        if name.startswith("rank") and name.endswith(".json"):
            with open(os.path.join(out, name)) as f:
                ranks[int(name[4:-5])] = json.load(f)["batches"]
    return ranks


def _model(rank: int, world: int, epochs: int) -> list[list[int]]:
    """Rank ``rank``'s batches over ``epochs`` epochs: its shard of each epoch's global order."""
    out = []
    for e in range(epochs):
        order = ll.ShardedSampler(1, 0, N, shuffle=True, seed=ORDER_SEED).order(e).tolist()
        per = -(-N // world)
        shard = [order[(rank + j * world) % N] for j in range(per)]
        out += [shard[i:i + BATCH] for i in range(0, per, BATCH)]
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    version = _require_lightning()
    assert version.startswith("2."), version
    root = tmp_path_factory.mktemp("lightning")
    ckpt = root / "ckpt"
    out = {"A": _run(root / "A", "--steps", "12"),
           "B": _run(root / "B", "--steps", "6", "--ckpt-dir", str(ckpt), "--every", "2")}
    assert sorted(os.listdir(ckpt)) == ["step=2.ckpt", "step=4.ckpt", "step=6.ckpt"]
    out["R6"] = _run(root / "R6", "--steps", "12", "--resume", str(ckpt / "step=6.ckpt"))
    out["R4"] = _run(root / "R4", "--steps", "8", "--resume", str(ckpt / "step=4.ckpt"))
    out["R6w1"] = _run(root / "R6w1", "--steps", "12", "--devices", "1", "--resume", str(ckpt / "step=6.ckpt"))
    out["root"] = root
    return out


@pytest.mark.long   # NOTE [ The slowest framework runs ] (tests/frameworks/__init__.py)
def test_a_straight_run_follows_the_documented_order(runs):
    for r in (0, 1):
        assert runs["A"][r] == _model(r, 2, 3)[:12], f"rank {r}"


@pytest.mark.long   # NOTE [ The slowest framework runs ] (tests/frameworks/__init__.py)
def test_each_rank_sees_the_batches_of_a_straight_run_after_a_resume(runs):
    a, b = runs["A"], runs["B"]
    for r in (0, 1):
        assert b[r] == a[r][:6], f"rank {r}: the first 6 steps"
        assert runs["R6"][r] == a[r][6:12], f"rank {r}: resumed mid-epoch at step 6"
        assert runs["R4"][r] == a[r][4:8], f"rank {r}: resumed at the epoch boundary (step 4)"


@pytest.mark.long   # NOTE [ The slowest framework runs ] (tests/frameworks/__init__.py)
def test_a_resume_on_one_device_delivers_what_the_two_ranks_left(runs):
    """Rank 0's state of a 2-device run resumes a 1-device run: the rest of epoch 1 (the
    samples neither rank took), then epoch 2 in full order."""
    order1 = ll.ShardedSampler(1, 0, N, shuffle=True, seed=ORDER_SEED).order(1).tolist()
    taken = {(r + 2 * j) for r in (0, 1) for j in range(2 * BATCH)}   # 2 batches of each rank
    left = [order1[p] for p in range(N) if p not in taken]
    rest = [left[i:i + BATCH] for i in range(0, len(left), BATCH)]
    got = runs["R6w1"][0]
    assert got[:len(rest)] == rest
    assert got[len(rest):] == _model(0, 1, 3)[16:16 + len(got) - len(rest)]   # epoch 2 (8 batches an epoch)


@pytest.mark.long   # NOTE [ The slowest framework runs ] (tests/frameworks/__init__.py)
def test_loader_monitor_logs_to_the_trainers_logger(runs):
    path = runs["root"] / "A" / "logs" / "version_0" / "metrics.csv"
    lines = path.read_text().splitlines()
    head = lines[0].split(",")
    rows = [dict(zip(head, line.split(","))) for line in lines[1:]]
    rows = [row for row in rows if row.get("loader/samples_per_s")]
    assert [int(row["step"]) for row in rows] == [2, 4, 6, 8, 10, 12]
    for row in rows:
        assert float(row["loader/samples_per_s"]) > 0
        assert 0 <= float(row["loader/wait_share"]) <= 1
        assert 0 <= float(row["loader/busy"]) <= 1


def test_loader_monitor_logs_scalars_and_the_verdict_to_tensorboard(tmp_path):
    """LoaderMonitor through Lightning's TensorBoardLogger: the scalars every 2 steps and the
    verdict's sentence as text (add_text), read back from the event file with TensorBoard's own
    reader."""
    _require_lightning()
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError as e:   # a test dependency: fail saying why, never skip
        pytest.fail(f"tensorboard does not import ({e}); `make test-long` installs it from requirements-frameworks.txt")
    _run(tmp_path, "--steps", "6", "--devices", "1", "--logger", "tensorboard")
    (events,) = (tmp_path / "logs" / "version_0").glob("events.out.tfevents.*")
    acc = EventAccumulator(str(events), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    rates = acc.Scalars("loader/samples_per_s")
    assert [e.step for e in rates] == [2, 4, 6] and all(e.value > 0 for e in rates)
    assert all(0 <= e.value <= 1 for e in acc.Scalars("loader/wait_share"))
    texts = [t for t in acc.Tags()["tensors"] if "verdict" in t]
    assert texts, acc.Tags()
    sentence = acc.Tensors(texts[0])[-1].tensor_proto.string_val[0].decode()
    assert sentence.strip(), "an empty verdict"


@pytest.mark.long   # NOTE [ The slowest framework runs ] (tests/frameworks/__init__.py)
def test_the_docs_example_runs(tmp_path, monkeypatch):
    """docs/integrations/lightning.md: its example trains, checkpoints, resumes and logs."""
    _require_lightning()
    root = os.path.dirname(os.path.dirname(HERE))
    with open(os.path.join(root, "docs", "integrations", "lightning.md"), encoding="utf-8") as f:
        (code,) = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "lightning.md", "exec"), {"__name__": "__doc_snippet__"})  # noqa: S102
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["step=12.ckpt", "step=6.ckpt"]
    files = sorted(tmp_path.glob("logs/*/version_*/metrics.csv"))
    assert len(files) == 2   # the first run and the resumed one
    for metrics in files:
        head, *rows = metrics.read_text().splitlines()
        col = head.split(",").index("loader/samples_per_s")
        rates = [float(r.split(",")[col]) for r in rows if r.split(",")[col]]
        assert rates and all(v > 0 for v in rates), rows


def test_a_lightning_outside_the_tested_range_is_refused_naming_the_version():
    _require_lightning()
    from loaderlib.integrations import lightning as integ

    for version in ("2.1.4", "3.0.0", "1.9.5"):
        with pytest.raises(ImportError, match=rf"Lightning >= 2\.2 and < 3\.0 .*{re.escape(version)} is installed"):
            integ._check_version(version)
    integ._check_version("2.6.6")
    with pytest.raises(ValueError, match="every_n_steps must be a positive int"):
        integ.LoaderMonitor(every_n_steps=0)
