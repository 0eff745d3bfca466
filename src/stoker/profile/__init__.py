"""stoker.profile."""
