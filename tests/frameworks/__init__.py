"""The training frameworks, run for real (marker ``frameworks``).

NOTE [ The slowest framework runs ]
``make test`` stays under its time budget on 2 cores (10 minutes on a fresh clone, installs
included), and ``.ci/run`` also runs ``make test-long``. The framework proofs are there: ``make
test-long`` installs requirements-frameworks.txt over the CPU torch (about 45 s of installs) and
runs every test marked ``frameworks`` or ``long``. On a fresh clone ``make test`` had spent about
2 to 3 minutes on them (Accelerate's and DCP's 2-process runs, Keras on three backends, LoaderMonitor
on TensorBoard, the installs); the runs that cost most besides (Lightning's five DDP runs,
about 2 minutes, the Hugging Face ``Trainer``'s runs, about 80 s, and each page's docs example,
which the docs build runs too: NOTE [ Framework pages run their example in the docs build ])
also carry ``long``, so ``pytest -m "frameworks and not long"`` is the quick pass over all six.
"""
