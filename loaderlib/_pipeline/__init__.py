"""The Pipeline wing: what runs behind the public ``loaderlib.pipeline`` façade.

- ``options``: ``PipelineOptions``, the frozen run options of ``Pipeline.with_options``.
- ``plan``: a pipeline's steps as data (``Step``), their labels and digests, and
  ``PipelineLike``, what the modules here need of a pipeline (none imports ``pipeline.py``).
- ``spec``: element specs (``TensorSpec``), computed from the source and each step.
- ``ops``: the Python operators, one node per step, with tf.data's semantics.
- ``engine``: the sources and the head node that runs on a private ``DataLoader``.
- ``cache``: the ``cache`` step: its store (memory or files) and the engine stage over cached pixels.
"""
