"""Models for the tests and benchmarks: built in code (`tests.models.builders`) and real
pretrained ones that pip packages ship (`tests.models.real`, ``python -m tests.models.real``)."""
