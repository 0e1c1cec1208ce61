"""The training layer: `GPTModule` (the LightningModule), its losses, metrics, optimizer, and the
callbacks and strategies runs use."""
