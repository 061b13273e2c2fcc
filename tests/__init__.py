"""attnzoo's tests, one folder per layer of the package (``tests/models`` tests ``attnzoo.models``, ...)."""
