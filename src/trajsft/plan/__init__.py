"""The typed plan: specs built once from the validated config."""
