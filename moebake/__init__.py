"""moebake: pre-bake Mixture-of-Experts checkpoints into kernel-native byte layouts.

Subpackages:
    layouts  -- pure tensor transforms (each with its inverse); no I/O.
    formats  -- safetensors file rules and source-checkpoint readers, one module per format.
    convert  -- planning, streaming, writing, manifest and verification of a conversion.
    serve    -- GPU runtime that loads baked checkpoints and runs the MoE kernels.
"""

__version__ = "0.1.0"
