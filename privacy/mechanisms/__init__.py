"""The mechanisms users can train with. Each module registers itself in :mod:`.registry`; callers look
mechanisms up there (``registry.get(name)``, ``registry.mechanisms()``) and never name them."""
