"""What the store has registered and where it points: the tensors collected and grouped by storage, their
entries and flat layouts, and the parked state (placeholders, the access guard) while their bytes are away.

Nothing here moves bytes or knows a backend: :mod:`refimpl.store.moves` does, on top of these records.
"""
