def load_vocab(path):
    with open(path) as f:
        return {line.strip(): i for i, line in enumerate(f) if line.strip()}


def tokenize(text, vocab):
    return [vocab.get(word, len(vocab)) for word in text.split()]
