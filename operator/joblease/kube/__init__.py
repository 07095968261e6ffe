"""The adapter to the API server: HTTP, conditional writes, Events. Nothing else talks to it."""
