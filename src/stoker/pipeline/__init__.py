"""stoker.pipeline."""
