"""Test models built in code (`models.builders`); loaders for real models come separately."""

from models.builders import BUILDERS, cnn, embedding, gru, if_constant, lstm, mlp, transformer

__all__ = ["BUILDERS", "cnn", "embedding", "gru", "if_constant", "lstm", "mlp", "transformer"]
