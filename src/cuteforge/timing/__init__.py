"""GPU timers: `events` (CUDA-event and back-to-back timing for benchmarks, `cuteforge
bench` and `cuteforge library`) and `graphs` (the autotuner's: one CUDA graph of many
launches per config, L2-cold); `clocks` records the SM clock and board power a benchmark
phase ran at."""
