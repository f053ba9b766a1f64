"""Morphlux torus slices: the torus model, the slice allocator and its evaluation (pure)."""
