"""A stand-in for slime's library code: the change group `library` watches it."""
