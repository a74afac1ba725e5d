import os

FEW_GPU = os.environ.get("FEW_GPU") == "1"
NUM_GPUS = 2 if FEW_GPU else 4


def test_checkpoint_round_trip():
    assert NUM_GPUS in (2, 4)
