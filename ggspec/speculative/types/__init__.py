"""The draft types: the registry, one module per type, what they share."""
