# Control: right values from a library softmax, which the kata forbids (banned-api fails).
import torch


def softmax(x, axis=-1):
    return torch.softmax(torch.from_numpy(x), dim=axis).numpy()
