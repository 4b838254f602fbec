"""Token corpora for language-model training: the formats users have (``formats.py``), the
sequences a training step takes (``dataset.py``, ``packing.py``) and the writer (``write.py``)."""
