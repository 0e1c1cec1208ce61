"""The data layer: task splits and text corpora in, typed batches out (see `batches.py`)."""
