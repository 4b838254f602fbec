"""The deterministic slice of the fuzz harness (``make fuzz`` runs the coverage-guided one)."""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_two_thousand_mutations_are_handled():
    sys.path.insert(0, os.path.join(ROOT, "fuzz"))
    try:
        import fuzz_decode
    finally:
        sys.path.pop(0)
    corpus = fuzz_decode._corpus([os.path.join(ROOT, "fuzz", "corpus")])
    fuzz_decode._GOOD = corpus[0]
    assert len(corpus) == 15
    assert fuzz_decode.run_slice(2000, corpus) == 2000
