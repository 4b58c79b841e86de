"""specrl: lossless speculative decoding inside RL post-training."""

__version__ = "0.1.0"
