"""A run: its Config, checkpoints, the pretrained start, local training (sequential and batched), a run's setup, the
round (messages, the server half, the clients' half, metrics, the round's order) and the loop.

See docs/development.md for the layers and what each may import."""
