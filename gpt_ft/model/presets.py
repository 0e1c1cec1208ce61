"""The named presets of `GPTConfig` (`GPTConfig.from_name`): each a dict of its fields, taken from the
paper or the released checkpoint's config.json."""

from __future__ import annotations

_GPT2 = dict(vocab_size=50257, n_positions=1024, pre_ln=True)
# Llama-family blocks: pre-norm RMSNorm, rotary positions, SwiGLU, no biases, no dropout.
_LLAMA = dict(pre_ln=True, norm="rmsnorm", positions="rope", activation="silu", gated_mlp=True, bias=False,
              layer_norm_epsilon=1e-5, embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0)  # fmt: skip

# Gemma 3 (text): Llama's blocks with Gemma's norms, GeGLU, 256-wide heads, one key/value head,
# and a global layer after every five local ones (1,024-token windows in the 4B and up, 512 here).
_GEMMA3 = dict(_LLAMA, norm="gemma_rmsnorm", activation="gelu_tanh", qk_norm=True, post_norms=True,
               scale_embeddings=True, n_positions=32768, n_head=4, n_kv_head=1, head_size=256,
               query_pre_attn_scalar=256, sliding_window=512, rope_theta=1000000.0,
               rope_local_theta=10000.0, layer_norm_epsilon=1e-6, hf_model_type="gemma3_text")  # fmt: skip


# Pythia's config.json: 2,048 positions, 50,304 rows, rotary_pct 0.25 of its 64-wide heads, base 10,000.
_PYTHIA = dict(pre_ln=True, positions="rope", rotary_dim=16, parallel_residual=True, activation="gelu",
               tie_embeddings=False, vocab_size=50304, n_positions=2048, embd_pdrop=0.0, attn_pdrop=0.0,
               resid_pdrop=0.0, hf_model_type="gpt_neox")  # fmt: skip


def _gemma3_layers(n: int) -> list[str]:
    return ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n)]


PRESETS: dict[str, dict] = {
    # GPT-1 (paper §4.1): 12 layers, 768 wide, 12 heads, FFN 3072, context 512, BPE vocab 40,478.
    "gpt1": {},
    # GPT-2 (Radford et al. 2019), the four released sizes.
    "gpt2": dict(_GPT2),
    "gpt2-medium": dict(_GPT2, n_embd=1024, n_layer=24, n_head=16),
    "gpt2-large": dict(_GPT2, n_embd=1280, n_layer=36, n_head=20),
    "gpt2-xl": dict(_GPT2, n_embd=1600, n_layer=48, n_head=25),
    # GPT-1-shaped models small enough to train on a laptop CPU.
    "gpt-mini": dict(n_embd=256, n_layer=4, n_head=4),
    "gpt-micro": dict(n_positions=128, n_embd=64, n_layer=2, n_head=2),
    # Today's small decoders (their config.json on the hub), for fine-tuning from their weights.
    "smollm2-135m": dict(_LLAMA, vocab_size=49152, n_positions=8192, n_embd=576, n_layer=30, n_head=9,
                         n_kv_head=3, n_inner=1536, rope_theta=100000.0, hf_model_type="llama"),
    "qwen2.5-0.5b": dict(_LLAMA, vocab_size=151936, n_positions=32768, n_embd=896, n_layer=24, n_head=14,
                         n_kv_head=2, n_inner=4864, rope_theta=1000000.0, layer_norm_epsilon=1e-6,
                         qkv_bias=True, hf_model_type="qwen2"),
    "llama-3.2-1b": dict(_LLAMA, vocab_size=128256, n_positions=131072, n_embd=2048, n_layer=16, n_head=32,
                         n_kv_head=8, n_inner=8192, rope_theta=500000.0, hf_model_type="llama",
                         rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                           high_freq_factor=4.0, original_max_position_embeddings=8192)),
    "qwen3-0.6b": dict(_LLAMA, vocab_size=151936, n_positions=40960, n_embd=1024, n_layer=28, n_head=16,
                       n_kv_head=8, head_size=128, n_inner=3072, qk_norm=True, rope_theta=1000000.0,
                       layer_norm_epsilon=1e-6, hf_model_type="qwen3"),
    "gemma-3-270m": dict(_GEMMA3, vocab_size=262144, n_embd=640, n_layer=18, n_inner=2048,
                         layer_types=_gemma3_layers(18)),
    "gemma-3-1b": dict(_GEMMA3, vocab_size=262144, n_embd=1152, n_layer=26, n_inner=6912,
                       layer_types=_gemma3_layers(26)),
    # SmolLM3: Llama's blocks, every fourth layer without rotary positions.
    "smollm3-3b": dict(_LLAMA, vocab_size=128256, n_positions=65536, n_embd=2048, n_layer=36, n_head=16,
                       n_kv_head=4, n_inner=11008, rope_theta=5000000.0, layer_norm_epsilon=1e-6,
                       nope_layers=list(range(3, 36, 4)), hf_model_type="smollm3"),
    # Pythia (GPT-NeoX): LayerNorm, rotary positions on a quarter of each head, attention and MLP
    # side by side, biases everywhere, an untied head.
    "pythia-70m": dict(_PYTHIA, n_embd=512, n_layer=6, n_head=8, n_inner=2048),
    "pythia-160m": dict(_PYTHIA, n_embd=768, n_layer=12, n_head=12, n_inner=3072),
    # OLMo 2 (OLMo-2-0425-1B): Llama's blocks with RMSNorm after attention and MLP only (none before),
    # RMSNorm over all heads' queries and keys, an untied head.
    "olmo-2-1b": dict(_LLAMA, vocab_size=100352, n_positions=4096, n_embd=2048, n_layer=16, n_head=16,
                      n_inner=8192, rope_theta=500000.0, layer_norm_epsilon=1e-6, norm="rmsnorm_fp32",
                      input_norms=False, post_norms=True, qk_norm=True, qk_norm_span="all_heads",
                      tie_embeddings=False, hf_model_type="olmo2"),
    "phi-3-mini": dict(_LLAMA, vocab_size=32064, n_positions=4096, n_embd=3072, n_layer=32, n_head=32,
                       n_inner=8192, sliding_window=2047, tie_embeddings=False, hf_model_type="phi3"),
    # Phi-4-mini: three quarters of each 128-wide head rotate; its released weights bring LongRoPE's
    # factors for 131,072 positions (here: the 4,096 of its original context, unscaled).
    "phi-4-mini": dict(_LLAMA, vocab_size=200064, n_positions=4096, n_embd=3072, n_layer=32, n_head=24,
                       n_kv_head=8, n_inner=8192, rotary_dim=96, hf_model_type="phi3"),
    # Llama-shaped models small enough to train on a laptop CPU.
    "llama-mini": dict(_LLAMA, n_positions=512, n_embd=256, n_layer=4, n_head=4, n_kv_head=2, n_inner=688),
    "llama-micro": dict(_LLAMA, n_positions=128, n_embd=64, n_layer=2, n_head=4, n_kv_head=2, n_inner=176),
}  # fmt: skip
