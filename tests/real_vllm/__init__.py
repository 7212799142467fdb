"""Real vLLM tests. A package, so its conftest does not replace the `conftest` module that test files import."""
