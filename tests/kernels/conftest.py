"""Fixtures of the kernel tests."""

from __future__ import annotations

import pytest

from loaderlib._ext import _jpeg


@pytest.fixture
def decoders():
    """Switches this process's decodes between loaderlib's Huffman decoders (True) and libjpeg's
    (False); restores the default."""
    yield lambda ours: _jpeg.set_huffman_decoder(ours)
    _jpeg.set_huffman_decoder(None)
