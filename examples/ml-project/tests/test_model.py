from mlp.model import score
from mlp.tokenizer import tokenize


def test_unknown_words_map_past_the_vocabulary():
    assert tokenize("a z", {"a": 0}) == [0, 1]


def test_score_sums_known_weights():
    assert score([0, 1, 2], {0: 1.0, 2: 0.5}) == 1.5
