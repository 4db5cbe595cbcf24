"""Fake torch.cuda.nccl."""


def version():
    return (2, 28, 3)
