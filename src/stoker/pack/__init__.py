"""stoker.pack."""
