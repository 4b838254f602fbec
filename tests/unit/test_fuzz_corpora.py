"""The fuzz targets of the Python parsers (fuzz/fuzz_parsers.py) on their seed corpora and on
every finding, kept as regression inputs in fuzz/corpus/<target>/: each input ends in the
documented error or in nothing, never another exception."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

import loaderlib as ll

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("fuzz_parsers", os.path.join(ROOT, "fuzz", "fuzz_parsers.py"))
assert _spec is not None and _spec.loader is not None
fuzz_parsers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz_parsers)


@pytest.mark.parametrize("target", sorted(fuzz_parsers.TARGETS))
def test_every_input_of_the_target_corpus_ends_in_the_documented_error_or_nothing(target):
    corpus = os.path.join(ROOT, "fuzz", "corpus", target)
    assert fuzz_parsers.replay(target, [corpus]) >= 2


def test_a_record_index_that_is_not_utf8_is_a_loader_error(tmp_path):
    """A finding of the recordio target: an .idx with bytes that are not UTF-8 raised
    UnicodeDecodeError while the file was read."""
    rec = tmp_path / "x.rec"
    rec.write_bytes(fuzz_parsers._good_rec())
    (tmp_path / "x.idx").write_bytes(b"\xff\xd8\xff\tbad\n")
    with pytest.raises(ll.LoaderError, match=r"line 1: expected 'key<TAB>offset'"):
        ll.ImageRecordDataset(str(rec))


def test_the_replay_reports_an_undocumented_exception_with_the_input(tmp_path, monkeypatch):
    """The regression test above can fail: an exception other than the documented one is a
    finding that names the input."""
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"version": 1}))

    def explode(data: bytes) -> None:
        raise KeyError("boom")

    monkeypatch.setitem(fuzz_parsers.TARGETS, "state", explode)
    with pytest.raises(AssertionError, match=r"fuzz target 'state' on .*bad\.json: KeyError"):
        fuzz_parsers.replay("state", [str(bad)])


def _state():
    fuzz_parsers._loader()
    return json.loads(json.dumps(fuzz_parsers._STATE))


def test_a_state_with_a_damaged_layout_is_a_state_error():
    """A finding of the state target: a layout without num_shards raised KeyError."""
    state = _state()
    state["layout"] = {"shard_id": 0}
    with pytest.raises(ll.StateError, match=r"not a loader state this loaderlib can load \(KeyError"):
        fuzz_parsers._loader().load_state_dict(state)


def test_a_state_naming_a_huge_world_is_refused_before_any_work_per_rank():
    """The ranks a merge walks come from the state: a world of 10**12 ranks is refused, not
    enumerated."""
    state = _state()
    state["layout"]["num_shards"] = 10**12
    with pytest.raises(ll.StateError, match=r"world of 1000000000000 ranks"):
        ll.merge_state_dicts([state])


def test_a_record_declaring_two_billion_labels_is_refused_before_its_buffer_is_allocated():
    """A .rec header's flag (up to 2**32) sizes the read of its labels: checked against the
    file first. In a process limited to 2 GiB of address space the 8 GiB read would be a
    MemoryError."""
    import subprocess
    import sys

    rec = os.path.join(ROOT, "fuzz", "corpus", "recordio", "finding-flag-declares-2g-labels.rec")
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)); "
            "import loaderlib as ll\n"
            "try:\n    ll.ImageRecordDataset(sys.argv[1])\n"
            "except ll.LoaderError as e:\n    print('refused:', e)\n")
    got = subprocess.run([sys.executable, "-c", code, rec], capture_output=True, text=True, check=False)
    assert got.returncode == 0, got.stderr[-2000:]
    assert "declares 2147483648 labels" in got.stdout
