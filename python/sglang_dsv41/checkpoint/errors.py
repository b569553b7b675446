"""The one error every checkpoint reader raises."""


class CheckpointError(ValueError):
    """The checkpoint does not match the config, or its bytes are malformed: names the file or tensor,
    the expectation and the finding."""
