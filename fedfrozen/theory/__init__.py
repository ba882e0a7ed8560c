"""The executable theory: the linear-attention model of the paper's Sec. 4 (linear_attention) and a softmax, multi-head
simulator (attention_sim).

See docs/development.md for the layers and what each may import."""
