"""The training frameworks, run for real (marker ``frameworks``).

NOTE [ The slowest framework runs ]
``make test`` stays under its time budget on 2 cores (about 10 minutes with the installs), and
``.ci/run`` also runs ``make test-long``. So the framework proofs whose runs cost most carry the
``long`` marker as well: Lightning's five DDP runs (about 2 minutes), the Hugging Face
``Trainer``'s runs (about 80 s) and each page's docs example, which the docs build runs too
(NOTE [ Framework pages run their example in the docs build ]). ``make test`` keeps a real
multi-process proof each of Accelerate and DCP, Keras on its three backends, Orbax on one
process, every version check and LoaderMonitor on TensorBoard.
"""
