"""One module per backend; each exposes `launch(spec, options) -> exit code`."""
