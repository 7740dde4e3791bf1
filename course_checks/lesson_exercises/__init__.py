"""One module per lesson (``lNN.py``) registering that lesson's exercises with ``@exercise``."""
