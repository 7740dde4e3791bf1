"""What a lesson's cells lean on beyond themselves: code a later lesson or a checker reuses after its own lesson
wrote it out (``onnx_runtime``, ``tensorrt_engines``, ``batching_sim``, ``pipeline``, ``precision``,
``quantization``), and plumbing that is no lesson's subject (``profiling``: where traces go; ``compilation``: torch's
private APIs read with a fallback across versions). The lesson is the code: read it there first."""
