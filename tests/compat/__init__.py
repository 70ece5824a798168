"""Compatibility with haystack-ai 3.4: tool schemas side by side, and haystack-ai's tool tests re-expressed."""
