"""Reference models that the toolkit's profiler, benchmarks and examples build (torch, DeepSpeed, transformers)."""
