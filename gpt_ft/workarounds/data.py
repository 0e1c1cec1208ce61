"""datasets: its cache keys and its requests to the Hub."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from datasets import Dataset


def dataset_fingerprint(dataset: Dataset) -> str:
    """datasets' fingerprint of `dataset`: a hash of its source and of every transform since, the key
    of its cache.

    datasets keeps it in `Dataset._fingerprint` with no public accessor; its own documentation of
    fingerprints reads that attribute (huggingface/datasets#1703). If it goes, hash what the rows
    come from ourselves (the files' paths, sizes and modification times).
    """
    return dataset._fingerprint


@contextmanager
def no_download_count() -> Iterator[None]:
    """datasets' loading of local files, without the request that counts a download.

    `datasets.load_dataset("csv", data_files=...)` first sends a HEAD request to the Hub to count a
    download of the packaged builder (`datasets.load.increase_load_count`, a 3 s timeout). On a
    machine without a network it waits on DNS instead: about 5 s, once per process, before a local
    file is read. A local file is no download, so the count is switched off for the call, through
    the module-level switch that datasets' own `HF_UPDATE_DOWNLOAD_COUNTS` environment variable
    sets (`datasets.config.HF_UPDATE_DOWNLOAD_COUNTS`, read at each call). If datasets moves or
    renames it, the request costs time again but nothing breaks.
    """
    import datasets

    saved = datasets.config.HF_UPDATE_DOWNLOAD_COUNTS
    datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = False
    try:
        yield
    finally:
        datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = saved
