"""stoker.integrations."""
