"""Code written out in the lessons and reused by later ones (generated: see scripts/nbcheck.py)."""
