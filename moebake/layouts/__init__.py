"""Pure tensor transforms between checkpoint layouts and kernel-native layouts.

Every transform here is a byte permutation (plus zero padding) with an exact inverse, works on
CPU tensors, and touches no files. Shapes are given as ``[E, rows, cols]`` with ``E`` experts.
"""
