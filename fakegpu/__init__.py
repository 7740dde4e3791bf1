"""The fake GPU of a CPU machine: ``ordering`` (the rules of stream order: vector clocks, races, when a freed block
may be reused; both models below apply them), ``streamcheck`` (a recording device module that finds unordered stream
accesses, lesson 10) and ``standins`` (the CPU stand-ins of the rehearsal: CUDA tensors, streams, graphs, ORT's CUDA
provider, TensorRT 11.1, pycuda)."""
