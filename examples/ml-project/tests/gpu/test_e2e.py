NUM_GPUS = 8


def test_end_to_end():
    assert NUM_GPUS == 8
