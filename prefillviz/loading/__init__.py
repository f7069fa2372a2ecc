"""Model loading: the bundled model and its cache, any Hugging Face id or local folder, the
recommended models, the hosted mode's policy, and the prompts the pages and the bench use."""
