"""Is there a real CUDA GPU? The one thing the stand-ins need to know about the machine.

Asked of torch's C layer, so the answer stays true while the stand-ins answer ``torch.cuda.is_available()``."""


def no_real_gpu() -> bool:
    """True when this machine has no real CUDA GPU."""
    import torch

    count = getattr(torch._C, "_cuda_getDeviceCount", None)
    return not (count and count() > 0)
