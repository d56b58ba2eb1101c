"""Reusable Qt widgets: hex view, bit diagram, nibble grid, plots."""
