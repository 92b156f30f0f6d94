"""EnvPipe's runtime on DeepSpeed's PipelineEngine: unit orders, non-blocking p2p, clock hooks."""
