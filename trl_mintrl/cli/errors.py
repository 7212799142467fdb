"""The error every `trl-mintrl train` check raises before anything loads."""


class RecipeError(ValueError):
    """A recipe or command line that cannot run; the message names the key and how to fix it."""
