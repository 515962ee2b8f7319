"""Foreign formats: the only place that knows Hugging Face and Google TF parameter and config names."""
