"""`trajsft serve`: a trained student behind an OpenAI-compatible API."""
