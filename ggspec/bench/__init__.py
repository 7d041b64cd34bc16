"""`ggspec bench`: speculative A/B and matrix benchmarks (llama-bench has no speculative mode).

prompts.py (built-in workload set, JSONL loader) -> configs.py (the matrix and what is skipped)
-> runner.py (interleaved, paired runs) -> report.py (rows, schema, formats) -> plots.py.
"""
