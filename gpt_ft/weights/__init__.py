"""Weights in and out, beside the model (which never imports this floor): the checkpoint format
(`checkpoint.py`), transformers import and export (`hf.py`, `hf_llama.py`, `hf_neox.py`; their rotary
parameters, `hf_rope.py`), hub ids (`hub.py`),
GGUF files read (`gguf_file.py`, `gguf_tokenizer.py`) and written (`gguf_write.py`, `gguf_vocab.py`),
and the one place a name of weights is resolved and the public `GPT` built (`pretrained.py`)."""
