"""Readers of foreign inputs that ``stoker pack`` turns into shards."""
