"""The data: the built-in and registered datasets (data), Shakespeare's release (shakespeare), the partitions into
clients, augmentation, and the feature shifts of notebook 13.

See docs/development.md for the layers and what each may import."""
