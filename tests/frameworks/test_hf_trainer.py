"""The Hugging Face ``Trainer`` resumes a loaderlib loader exactly with
``LoaderCheckpointCallback`` (NOTE [ Loader state in the Hugging Face Trainer ]).

The real framework on CPU: 2 processes under torchrun (gloo), each run new processes running
``hf_trainer_run.py``. Run A trains 12 steps straight; run B trains 6 with a checkpoint every
2 steps; new jobs resume with ``train(resume_from_checkpoint=...)`` from step 6 (mid-epoch: 4
batches per epoch per rank) to 12 and from step 4 (an epoch boundary) to 8. Each rank's batches
must equal run A's from the same step, and run A must follow the documented order (a
plain-Python model: each epoch's global order, rank ``r`` taking slots ``r, r + 2, ...``).
One-process jobs (marker ``long``) resume the same checkpoints (NOTE [ The Trainer's epoch
numbers after a resume ]): they must deliver the positions of the state's epoch the two ranks left, in order,
then the next epochs of one process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import loaderlib as ll

pytestmark = pytest.mark.frameworks

HERE = os.path.dirname(os.path.abspath(__file__))
N, BATCH, ORDER_SEED = 30, 4, 3   # as in hf_trainer_run.py


def _require_transformers():
    try:
        import transformers
    except ImportError as e:   # a test dependency: fail saying why, never skip
        pytest.fail(f"transformers does not import ({e}); it is a test dependency: `make test-long` installs "
                    "requirements-frameworks.txt over the local CPU torch")
    return transformers


def _run(out, ckpt, *args: str, procs: int = 2) -> dict[int, dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}",
           "hf_trainer_run.py", str(out), "--ckpt-dir", str(ckpt), *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=HERE,
                       env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert p.returncode == 0, f"{' '.join(cmd[3:])} failed:\n{(p.stdout + p.stderr)[-4000:]}"
    got = {}
    for r in range(procs):
        with open(os.path.join(out, f"rank{r}.json")) as f:
            got[r] = json.load(f)
    return got


def _model(rank: int, world: int, epochs: int) -> list[list[int]]:
    out = []
    for e in range(epochs):
        order = ll.ShardedSampler(1, 0, N, shuffle=True, seed=ORDER_SEED).order(e).tolist()
        per = -(-N // world)
        shard = [order[(rank + j * world) % N] for j in range(per)]
        out += [shard[i:i + BATCH] for i in range(0, per, BATCH)]
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    _require_transformers()
    root = tmp_path_factory.mktemp("hf_trainer")
    ck = root / "ckpt"
    return {"A": _run(root / "A", root / "a-ckpt", "--steps", "12"),
            "B": _run(root / "B", ck, "--steps", "6", "--save-steps", "2"),
            "R6": _run(root / "R6", ck, "--steps", "12", "--resume", str(ck / "checkpoint-6")),
            "R4": _run(root / "R4", ck, "--steps", "8", "--resume", str(ck / "checkpoint-4")),
            "root": root, "ckpt": ck}


@pytest.fixture(scope="module")
def one_process(runs):
    """Run B's checkpoints resumed by one-process jobs (``long``: two more jobs)."""
    root, ck = runs["root"], runs["ckpt"]
    return {"R6w1": _run(root / "R6w1", ck, "--steps", "20", "--resume", str(ck / "checkpoint-6"), procs=1),
            "R4w1": _run(root / "R4w1", ck, "--steps", "8", "--resume", str(ck / "checkpoint-4"), procs=1)}


@pytest.mark.long   # NOTE [ The slowest framework runs ] (tests/frameworks/__init__.py)
def test_each_rank_sees_the_batches_of_a_straight_run_after_a_resume(runs):
    a = runs["A"]
    for r in (0, 1):
        assert a[r]["batches"] == _model(r, 2, 3)[:12], f"rank {r}: the straight run"
        assert runs["B"][r]["batches"] == a[r]["batches"][:6]
        assert runs["R6"][r]["batches"] == a[r]["batches"][6:12], f"rank {r}: resumed mid-epoch at step 6"
        assert runs["R4"][r]["batches"] == a[r]["batches"][4:8], f"rank {r}: resumed at the epoch boundary"
        assert runs["R6"][r]["applied"] == runs["R4"][r]["applied"] == "own"


def _left(epoch: int, taken: int) -> list[list[int]]:
    """What one process delivers of ``epoch`` after 2 ranks took ``taken`` batches each."""
    order = ll.ShardedSampler(1, 0, N, shuffle=True, seed=ORDER_SEED).order(epoch).tolist()
    gone = {r + 2 * j for r in (0, 1) for j in range(taken * BATCH)}
    left = [order[p] for p in range(N) if p not in gone]
    return [left[i:i + BATCH] for i in range(0, len(left), BATCH)]


@pytest.mark.long
def test_one_process_resumes_what_two_left(one_process):
    """Saved by 2 processes (4 batches an epoch each), resumed on 1 (8 an epoch): the Trainer
    counts 6 steps as its epoch 0, the state is in epoch 1."""
    r6, r4 = one_process["R6w1"][0], one_process["R4w1"][0]
    assert r6["applied"] == r4["applied"] == "merged"
    rest = _left(1, 2)   # step 6: 2 batches of each rank's epoch 1
    assert len(rest) == 4 and r6["batches"][:4] == rest
    assert r6["batches"][4:] == _model(0, 1, 4)[16:26], "the epochs after the resumed one: one process's"
    assert len(r6["batches"]) == 14
    assert r4["batches"] == _left(1, 0)[:4] == _model(0, 1, 2)[8:12], "step 4: epoch 1 from its start"


def test_the_callback_refuses_what_would_resume_wrongly(tmp_path):
    transformers = _require_transformers()
    from loaderlib.integrations.hf_trainer import LoaderCheckpointCallback

    ld = ll.DataLoader(ll.ArrayDataset(np.arange(N)), batch_size=BATCH, seed=0,
                       sampler=ll.ShardedSampler(2, 0, shuffle=True, seed=ORDER_SEED))
    cb = LoaderCheckpointCallback(ld)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    state = transformers.TrainerState()
    with pytest.raises(ValueError, match=r"ignore_data_skip=True.*skip_first_batches"):
        cb.on_train_begin(args, state, None)
    folder = tmp_path / "checkpoint-6"
    folder.mkdir()
    with pytest.raises(ll.StateError, match="holds no loaderlib state"):
        cb.restore(str(folder), 0, 2)
    for r in range(3):   # 3 of the 4 ranks of a job saved their state
        (folder / f"loaderlib-state-rank{r}.json").write_text(json.dumps(ll.DataLoader(
            ll.ArrayDataset(np.arange(N)), batch_size=BATCH, seed=0,
            sampler=ll.ShardedSampler(4, r, shuffle=True, seed=ORDER_SEED)).state_dict()))
    with pytest.raises(ll.StateError, match=r"the states of ranks \[3\] are missing"):
        cb.restore(str(folder), 0, 2)   # another number of processes needs every rank's state
    with pytest.raises(TypeError, match="loaderlib DataLoader"):
        LoaderCheckpointCallback(object())


@pytest.mark.long   # NOTE [ The slowest framework runs ] (tests/frameworks/__init__.py)
def test_the_docs_example_runs(tmp_path, monkeypatch):
    """docs/integrations/hf-trainer.md: one process; the resumed run trains steps 4..6."""
    import re

    _require_transformers()
    root = os.path.dirname(os.path.dirname(HERE))
    with open(os.path.join(root, "docs", "integrations", "hf-trainer.md"), encoding="utf-8") as f:
        (code,) = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "hf-trainer.md", "exec"), {"__name__": "__doc_snippet__"})  # noqa: S102
    for step in (3, 6):
        state = json.loads((tmp_path / "out" / f"checkpoint-{step}" / "loaderlib-state-rank0.json").read_text())
        assert (state["epoch"], state["delivered"]) == (0, step)   # 8 batches an epoch


def test_a_transformers_outside_the_supported_range_is_refused_naming_the_version():
    """NOTE [ Framework version ranges ]."""
    import re

    _require_transformers()
    from loaderlib.integrations import hf_trainer

    assert hf_trainer.SUPPORTED == ((5, 0), (6, 0))
    for version in ("4.57.1", "6.0.0", "3.5.1"):
        with pytest.raises(ImportError, match=rf"hf_trainer needs transformers >= 5\.0 and < 6\.0 \(.*\), but "
                                              rf"transformers {re.escape(version)} is installed"):
            hf_trainer._check_version(version)
    hf_trainer._check_version("5.23.0")
    hf_trainer._check_version("5.0.0rc1")
