"""mtpstack: serve MLX models with MTP speculative decoding across a fleet."""

__version__ = "0.1.0"
