"""Numbers derived from a run or a model config: FLOPs, bytes, roofline, attention maps."""
