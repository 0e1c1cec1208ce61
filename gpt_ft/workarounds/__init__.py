"""Every use of another library's private API, each behind one small named function.

Lightning, jsonargparse, torch, datasets, gguf and transformers offer no public way to do a few
things this toolkit needs. Each is done here and only here, a module per library (`trainer`:
Lightning's loops and callbacks; `cli`: LightningCLI and jsonargparse; `parsing`: jsonargparse's
parse made faster; `kernels`: torch; `data`: datasets; `gguf_files`: gguf's reader and
transformers' GGUF loading), with a comment naming the upstream issue or pull request (or, where
there is none, the public API missing and the upstream source relied on) and what to do when
upstream changes. tests/test_workarounds.py fails when a behaviour relied on changes. Every layer
uses this package, the lowest included, so it imports no heavy library at import time.
"""
