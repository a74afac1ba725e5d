def score(tokens, weights):
    return sum(weights.get(t, 0.0) for t in tokens)
