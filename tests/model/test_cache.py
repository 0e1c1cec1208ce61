import torch

from tests.helpers import TINY, tiny_gpt


def test_kv_cache_prefill_in_chunks_equals_full_forward():
    gpt = tiny_gpt()
    ids = torch.randint(0, TINY["vocab_size"], (2, 30))
    cache = gpt.new_kv_cache(2)
    with torch.no_grad():
        full = gpt(ids)
        chunks = [
            gpt(ids[:, :12], kv_cache=cache),
            gpt(ids[:, 12:13], kv_cache=cache),
            gpt(ids[:, 13:], kv_cache=cache),
        ]
    assert cache.length == 30
    torch.testing.assert_close(torch.cat(chunks, dim=1), full, rtol=0, atol=1e-5)
