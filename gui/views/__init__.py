"""Qt views of Quantscope (one module per tab or dialog)."""
