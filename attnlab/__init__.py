"""attnlab."""
