"""One offload or reload in flight: its stages in order (:mod:`~refimpl.store.moves.offload`,
:mod:`~refimpl.store.moves.reload`), the paths an offload takes, its copies, its release, and the copies a
caller issues early.

Each move changes the records of :mod:`refimpl.store.state` through their own methods and has a backend
(:mod:`refimpl.store.backends`) hold the bytes.
"""
