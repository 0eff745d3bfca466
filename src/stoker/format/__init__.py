"""stoker.format."""
