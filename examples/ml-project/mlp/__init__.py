"""A tiny stand-in for an ML package: a tokenizer over a vocabulary file and a model
that scores token sequences. The CI example runs its tests; nothing here needs a GPU."""
