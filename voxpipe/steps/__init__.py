"""Each step in one place: its settings (a params section) and its descriptor."""
