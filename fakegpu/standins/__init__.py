"""Stand-ins for GPU software on a CPU machine: the rehearsal's CUDA device (``tensor``, ``streams``, ``graphs``,
``cuda``, and ``kernels``: the kernel CUDA would choose, with cuDNN's autotuning workspace, the SDPA backends, the
precision in force at each call and the profiler's device events), ONNX Runtime's CUDA provider (``ort``) and
TensorRT 11.1 (``tensorrt``). See
:mod:`fakegpu.standins.rehearsal` for how a lesson's GPU sections run on them, and ``tensorrt`` for the
fake TensorRT that the contract tests and exercise 08 also use.

``tensor`` is the floor of the stand-in GPU; ``dispatch``, ``copies`` and ``memory`` fill its hook slots
(``tensor.HOOKS``) when they are imported. They are imported here, so the slots are set whichever stand-in a caller
imports first."""

from fakegpu.standins import copies, dispatch, memory  # noqa: F401 - they fill tensor.HOOKS
