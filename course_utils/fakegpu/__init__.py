"""The fake GPU of a CPU machine: ``streamcheck`` (a recording device module that finds unordered stream
accesses, lesson 10) and ``standins`` (the CPU stand-ins of the rehearsal: CUDA tensors, streams, graphs, ORT's CUDA
provider, TensorRT 11.1, pycuda)."""
