"""Data-parallel training on local workers with any gradsync algorithm (``gradsync train``)."""
