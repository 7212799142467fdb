"""The package version, in a leaf module: the lazy package face, the CLI, the model card and the endpoint judge
all read it from here without importing anything else of the package."""

__version__ = "0.1.0"
