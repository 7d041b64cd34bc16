"""`ggspec serve`: an OpenAI-compatible HTTP server over the speculative engine.

  scheduler  the engine on its own thread: continuous batching, a bounded queue, cancellation
  protocol   OpenAI request bodies (validated) and the responses / stream chunks built from them
  chat       the model's chat template (Jinja from its GGUF, or one of llama.cpp's built-in ones)
  text       token ids -> text: incremental UTF-8 and stop strings
  metrics    Prometheus counters in the style of vLLM's spec-decode metrics
  app        the Starlette application: routes, admission, streaming (SSE), errors
"""
