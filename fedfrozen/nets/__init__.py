"""The models (models, layouts), their attention split into Q, K and V with the parameter groups (qkv), the flat
parameter buffers (flat) and the local update rule on them (update).

See docs/development.md for the layers and what each may import."""
