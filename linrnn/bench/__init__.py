"""``linrnn bench``: the benchmark suite (registry, counts, isolation, peers, reports, plots).

One job per module:

- :mod:`~linrnn.bench.registry` — the linrnn ops, input recipe, shapes and named suites
  (``quick``, ``paper``, ``headdim``, ``chunksize``, ``delta``, ``mamba2``, ``decode``,
  ``varlen``, ``train``);
- :mod:`~linrnn.bench.decode` — the decode suite (tokens/s of one-token steps, step peers);
- :mod:`~linrnn.bench.varlen` — the varlen suite (packed documents vs padded);
- :mod:`~linrnn.bench.training` — the train suite (whole-model training tokens/s of every
  mixer beside softmax attention, loss curves);
- :mod:`~linrnn.bench.flops` — FLOP and byte formulas (TFLA paper, App. F/G), GPU specs, the
  roofline floor and the runtime-optimal chunk size;
- :mod:`~linrnn.bench.worker` — subprocess isolation with a timeout per item;
- :mod:`~linrnn.bench.timing` — do_bench / perf_counter medians, peak memory, first call;
- :mod:`~linrnn.bench.peers` — fla, mlstm_kernels and torch SDPA beside linrnn;
- :mod:`~linrnn.bench.report` — machine info, tables (rich or plain), JSON, progress bar;
- :mod:`~linrnn.bench.plots` — runtime vs length, memory vs chunk size, roofline, loss curves
  (matplotlib);
- :mod:`~linrnn.bench.autotune` — ``choose_chunk_size`` for ``chunk_size="auto"``;
- :mod:`~linrnn.bench.cli` — the command line (``linrnn bench``, ``python -m linrnn.bench``).

Importing this package is light: torch only (no Triton, matplotlib, rich or tqdm).
"""

from linrnn.bench.autotune import choose_chunk_size

__all__ = ["choose_chunk_size"]
