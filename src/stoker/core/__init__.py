"""stoker.core."""
