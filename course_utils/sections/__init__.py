"""Above the ground, with the fake GPU: the life cycle of a GPU-only section (``gpu_sections``) and the set-up
cell every lesson starts with (``lesson``)."""
