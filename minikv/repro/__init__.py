"""Reproductions of the historical defects: run buggy and fixed engines side by side and check the signatures."""
